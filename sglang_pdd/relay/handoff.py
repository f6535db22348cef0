"""RelayDecode's side of the handoff, as a plain state machine over the token channel.

The scheduler hook feeds it every request it admits (`track`) and calls `poll` once per scheduler
iteration, between batches, with a `RelayOps` that can tell whether a request is decoding and can
finish it with the handoff reason. For each relayed request (keyed by RLD's bootstrap room R):

* `Watch(R)` from MD: MD admitted its copy. If RLD finishes R by itself (EOS, length, abort) it
  sends `Finished(R)`, so MD aborts its WAN transfer and frees its slots.
* `Ready(R)` from MD: MD's KV arrived. As soon as R is decoding, RLD sends `Tokens(R, 0, [t1..tk])`
  and ends R with the handoff finish (k = number of tokens sent; its stream carries exactly those).
  If R already finished, the answer is `Finished(R)`; if R is unknown after `timeout_s`, `Reject(R)`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch

logger = logging.getLogger(__name__)


class RelayOps(Protocol):
    def is_decoding(self, req: Any) -> bool: ...

    def finish_with_handoff(self, req: Any, k: int) -> None: ...

    def output_logprobs(self, req: Any, k: int) -> list[float] | None: ...


class Channel(Protocol):
    def poll(self) -> list[tuple[bytes, Any]]: ...

    def send(self, peer: bytes, msg: Any) -> bool: ...


@dataclass
class _Room:
    req: Any = None
    watcher: bytes | None = None
    ready_from: bytes | None = None
    ready_at: float = 0.0
    finished_at: float | None = None
    created: float = field(default_factory=time.monotonic)


@dataclass
class RelayStats:
    handoffs: int = 0
    handoff_tokens: int = 0
    finished_locally: int = 0
    rejected: int = 0


def finish_type(req: Any) -> str:
    reason = getattr(req, "finished_reason", None)
    try:
        return str(reason.to_json().get("type", "unknown"))
    except Exception:
        return "unknown"


class RelayHandoff:
    def __init__(self, channel: Channel, timeout_s: float, now: Callable[[], float] = time.monotonic):
        self.channel = channel
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
                room.ready_from, room.ready_at = peer, self.now()
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
            if room.watcher is not None:
                n = len(req.output_ids)
                self._drop(room_id, Finished(room=room_id, reason=finish_type(req), n_tokens=n), room.watcher)
            elif now - room.finished_at > self.timeout_s:
                self.rooms.pop(room_id, None)  # main never showed up
            return
        if room.ready_from is not None and ops.is_decoding(req) and req.output_ids:
            ids = [int(t) for t in req.output_ids]
            logprobs = ops.output_logprobs(req, len(ids))
            ops.finish_with_handoff(req, len(ids))
            self.stats.handoffs += 1
            self.stats.handoff_tokens += len(ids)
            logger.debug("relay room %s: handed off %d eager tokens", room_id, len(ids))
            self._drop(room_id, Tokens(room=room_id, start=0, ids=ids, final=True, logprobs=logprobs), room.ready_from)

    def _drop(self, room_id: int, reply: Any, peer: bytes) -> None:
        self.rooms.pop(room_id, None)
        if isinstance(reply, Reject):
            self.stats.rejected += 1
        self.channel.send(peer, reply)
