"""RelayDecode's side of the handoff, as a plain state machine over the token channel.

The scheduler hook feeds it every request it admits (`track`) and calls `poll` once per scheduler
iteration, between batches, with a `RelayOps` that can tell whether a request is decoding and can
finish it with the handoff reason. For each relayed request (keyed by RLD's bootstrap room R):

* `Watch(R)` from MD: MD admitted its copy. If RLD finishes R by itself (EOS, length, abort) it
  sends `Finished(R)`, so MD aborts its WAN transfer and frees its slots.
* `Ready(R, have=0, mode)` from MD: MD's KV arrived. RLD fixes the handoff mode (one-shot, catch-up,
  or adaptive: `HandoffModePolicy` over RLD's load, MD's batch and the eager tokens so far).
  One-shot: as soon as R is decoding, RLD sends `Tokens(R, 0, [t1..tk], final)` and ends R with the
  handoff finish (its `handoff_tokens`: the number of tokens sent; its stream carries exactly those).
  Catch-up: RLD sends at most `chunk` tokens `Tokens(R, have, [...], final=False)` and keeps
  decoding; MD recomputes them and asks again with `Ready(R, have=have+len)`. Once at most `gap`
  tokens remain the answer is final and R ends as in one-shot. A catch-up that cannot converge (RLD
  decodes more per round than a chunk carries: MD was no closer `max_stalls` times running) or
  runs `max_rounds` chunks also goes final, with the rest in one step.
  If R already finished, the answer is `Finished(R)`; if R is unknown after `timeout_s`, `Reject(R)`.

Besides its running `stats`, it reports each event as it happens to `record(event, value)`:
"finished_locally" (None), "mode" ((mode, reason label)), "chunk" (tokens of a non-final chunk sent),
"load" (the `HandoffLoad` of an adaptive choice).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch
from sglang_pdd.policy.handoff_mode import HandoffLoad, HandoffMode, HandoffModePolicy

logger = logging.getLogger(__name__)


class RelayOps(Protocol):
    def is_decoding(self, req: Any) -> bool: ...

    def finish_with_handoff(self, req: Any, handoff_tokens: int, mode: str) -> None: ...

    def output_logprobs(self, req: Any, start: int, end: int) -> list[float] | None: ...

    def load(self) -> tuple[int, float]: ...  # (requests decoding, KV pool usage 0..1)


class Channel(Protocol):
    def poll(self) -> list[tuple[bytes, Any]]: ...

    def send(self, peer: bytes, msg: Any) -> bool: ...


@dataclass
class _Room:
    req: Any = None
    watcher: bytes | None = None
    ready_from: bytes | None = None
    ready: Ready | None = None  # the Ready being answered
    ready_at: float = 0.0
    mode: HandoffMode | None = None  # fixed on the first Ready
    sent: int = 0  # eager tokens sent so far (catch-up)
    rounds: int = 0  # non-final chunks sent
    last_gap: int = 0  # tokens MD was behind at the previous answer
    stalls: int = 0  # consecutive answers at which MD was no closer than before
    finished_at: float | None = None
    created: float = field(default_factory=time.monotonic)


@dataclass
class RelayStats:
    handoffs: int = 0
    handoff_tokens: int = 0
    finished_locally: int = 0
    rejected: int = 0
    chunks: int = 0  # non-final catch-up chunks sent
    chunk_tokens: int = 0
    modes: dict[tuple[str, str], int] = field(default_factory=dict)  # (mode, reason label) -> count
    last_load: HandoffLoad | None = None  # the inputs of the last adaptive choice


def _ignore(event: str, value: Any) -> None:
    pass


def no_hold(req: Any) -> bool:
    """The production `hold`: every Ready is answered as soon as the request can answer it."""
    return False


def output_logprobs(req: Any, start: int, end: int) -> list[float] | None:
    """The logprobs of a request's output tokens start..end, None without them (RelayOps.output_logprobs)."""
    if not req.return_logprob:
        return None
    vals = list(req.logprob.output_token_logprobs_val or [])
    return [float(v) for v in vals[start:end]] if len(vals) >= end else None


def finish_type(req: Any) -> str:
    reason = getattr(req, "finished_reason", None)
    try:
        return str(reason.to_json().get("type", "unknown"))
    except Exception:
        return "unknown"


class RelayHandoff:
    def __init__(self, channel: Channel, timeout_s: float, now: Callable[[], float] = time.monotonic,
                 policy: HandoffModePolicy | None = None, max_rounds: int = 32, max_stalls: int = 2,
                 record: Callable[[str, Any], None] = _ignore, hold: Callable[[Any], bool] = no_hold):
        self.channel = channel
        self.record = record
        self.hold = hold  # True while a request's Ready stays unanswered (the tests' control: relay/controls.py)
        self.max_stalls = max_stalls
        self.policy = policy or HandoffModePolicy()
        self.max_rounds = max_rounds
        self.timeout_s = timeout_s
        self.now = now
        self.rooms: dict[int, _Room] = {}
        self.stats = RelayStats()

    def track(self, req: Any) -> None:
        room = getattr(req, "bootstrap_room", None)
        if room is None:
            return
        self.rooms.setdefault(room, _Room(created=self.now())).req = req

    def poll(self, ops: RelayOps) -> None:
        for peer, msg in self.channel.poll():
            self._on_message(peer, msg)
        now = self.now()
        for room_id, room in list(self.rooms.items()):
            self._advance(room_id, room, ops, now)

    def _on_message(self, peer: bytes, msg: Any) -> None:
        room = self.rooms.get(msg.room)
        if isinstance(msg, (Watch, Ready)):
            if room is None:
                room = self.rooms[msg.room] = _Room(created=self.now())
            room.watcher = peer
            if isinstance(msg, Ready):
                if msg.have != room.sent:
                    self._drop(msg.room, Reject(room=msg.room, reason=f"ready at {msg.have} tokens, "
                                                f"{room.sent} were sent"), peer)
                    return
                room.ready_from, room.ready, room.ready_at = peer, msg, self.now()
            logger.debug("relay room %s: %s from main", msg.room, type(msg).__name__)
        else:
            self.stats.rejected += 1
            self.channel.send(peer, Reject(room=msg.room, reason=f"relay does not accept {type(msg).__name__}"))

    def _advance(self, room_id: int, room: _Room, ops: RelayOps, now: float) -> None:
        req = room.req
        if req is None:
            if room.ready_from is not None and now - room.ready_at > self.timeout_s:
                self._drop(room_id, Reject(room=room_id, reason="unknown room"), room.ready_from)
            elif room.ready_from is None and now - room.created > self.timeout_s:
                self.rooms.pop(room_id, None)  # a Watch for a request that never came
            return
        if req.finished():
            if room.finished_at is None:
                room.finished_at = now
                self.stats.finished_locally += 1
                self.record("finished_locally", None)
            if room.watcher is not None:
                n = len(req.output_ids)
                self._drop(room_id, Finished(room=room_id, reason=finish_type(req), n_tokens=n), room.watcher)
            elif now - room.finished_at > self.timeout_s:
                self.rooms.pop(room_id, None)  # main never showed up
            return
        n = len(req.output_ids)
        if room.ready_from is not None and ops.is_decoding(req) and n > room.sent and not self.hold(req):
            self._answer(room_id, room, req, ops)

    def _answer(self, room_id: int, room: _Room, req: Any, ops: RelayOps) -> None:
        ready, peer, n, j = room.ready, room.ready_from, len(req.output_ids), room.sent
        if room.mode is None:
            room.mode = self._choose(ready, n, ops)
        gap = n - j
        room.stalls = room.stalls + 1 if room.rounds and gap >= room.last_gap else 0
        room.last_gap = gap
        final = (room.mode is HandoffMode.ONE_SHOT or gap <= ready.gap or room.rounds >= self.max_rounds
                 or room.stalls >= self.max_stalls)
        end = n if final else min(n, j + ready.chunk)
        ids = [int(t) for t in req.output_ids[j:end]]
        msg = Tokens(room=room_id, start=j, ids=ids, final=final, logprobs=ops.output_logprobs(req, j, end),
                     mode=room.mode.value)
        if final:
            handoff_tokens = n  # every eager token: MD takes over from here
            ops.finish_with_handoff(req, handoff_tokens, room.mode.value)
            self.stats.handoffs += 1
            self.stats.handoff_tokens += handoff_tokens
            logger.debug("relay room %s: handed off %d eager tokens (%s)", room_id, handoff_tokens, room.mode.value)
            self._drop(room_id, msg, peer)
            return
        room.sent, room.rounds, room.ready_from, room.ready = end, room.rounds + 1, None, None
        self.stats.chunks += 1
        self.stats.chunk_tokens += len(ids)
        self.record("chunk", len(ids))
        self.channel.send(peer, msg)

    def _choose(self, ready: Ready, eager: int, ops: RelayOps) -> HandoffMode:
        if ready.mode != "adaptive":  # one-shot or catch-up, as MD asked
            mode, label = HandoffMode(ready.mode), "requested"
        else:
            running, usage = ops.load()
            load = HandoffLoad(running, usage, ready.md_batch, eager_tokens=eager, chunk_tokens=ready.chunk)
            d = self.policy.decide(load)
            mode, label, self.stats.last_load = d.mode, d.label, load
            self.record("load", load)
        key = (mode.value, label)
        self.stats.modes[key] = self.stats.modes.get(key, 0) + 1
        self.record("mode", key)
        return mode

    def _drop(self, room_id: int, reply: Any, peer: bytes) -> None:
        self.rooms.pop(room_id, None)
        if isinstance(reply, Reject):
            self.stats.rejected += 1
        self.channel.send(peer, reply)
