"""MainDecode's side of the handoff, as a plain state machine over the token channel.

Per relayed request (MD's copy, keyed by the relay's address and room):

    admitted --(KV transfer done: kv_arrived)--> waiting_tokens --(Tokens)--> ready --(take_ready)--> gone
       |                                              ^                         |  (final tokens)
       |                                              +--(chunk_done)-- extending <-+  (catch-up chunk)
       |   \\_____________ Finished / Reject / timeout: an abort action _____________/
       +--(Finished, keep_kv)--> draining --(kv_arrived)--> an abort action that keeps the KV

Every state has a deadline: admitted and draining (the KV has not landed) `kv_timeout_s` from
admission, waiting_tokens and ready `timeout_s` from entering it; extending lasts one iteration. An
entry whose request sglang ended itself (a failed transfer, an abort) is forgotten at the next `poll`.

`admit` sends `Watch` at once, so a relay that finishes the request itself can say so while MD's WAN
transfer is still running. `kv_arrived` sends `Ready(have=0, mode, chunk, gap, md_batch)`. Tokens
must continue exactly where MD's KV ends (`start == have`). A non-final (catch-up) chunk is
recomputed by an EXTEND whose sampled token is dropped; `chunk_done` then asks for the rest with
`Ready(have)`. The final tokens go through the one-shot path. `poll` turns channel messages and
timeouts into `Abort` actions for the scheduler hook, which knows where the request sits.

Besides its running `stats`, it reports each event as it happens to `record(event, value)`: "chunk"
(tokens of a catch-up chunk recomputed), "handoff" (the mode the relay chose for a completed handoff),
"unknown_message" (None: a message for a room it does not know).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch
from sglang_pdd.protocol.request import RequestParams

logger = logging.getLogger(__name__)


class HandoffState(enum.Enum):
    """Where one relayed request is (see the diagram above); the value is its /metrics label."""

    ADMITTED = "admitted"
    DRAINING = "draining"  # the relay finished the request; MD lets its KV land, keeps it, and ends it
    WAITING_TOKENS = "waiting_tokens"
    READY = "ready"
    EXTENDING = "extending"  # a catch-up chunk is in this iteration's EXTEND batch


ADMITTED, DRAINING, WAITING_TOKENS, READY, EXTENDING = HandoffState
HELD = (WAITING_TOKENS, READY, EXTENDING)  # the KV arrived: sglang's queues no longer see the request
STATES = tuple(HandoffState)


def _ignore(event: str, value: Any) -> None:
    pass


class Channel(Protocol):
    def poll(self) -> list[tuple[str, Any]]: ...

    def send(self, addr: str, msg: Any) -> bool: ...


@dataclass
class Pending:
    req: Any
    relay: str
    relay_room: int
    state: HandoffState = ADMITTED
    since: float = 0.0
    tokens: list[int] | None = None  # the tokens to recompute next, from index `have`
    logprobs: list[float] | None = None
    final: bool = True  # `tokens` end the handoff (one-shot, or catch-up's last chunk)
    have: int = 0  # eager tokens whose KV MD has computed (catch-up chunks done)
    mode: str = "adaptive"  # what MD asks for: one-shot, catch-up, adaptive
    chunk: int = 32
    chosen: str = ""  # the mode the relay chose
    drop_eager_kv: bool = False  # test-only negative control (test_switches.TestKnobs)

    @property
    def handoff_tokens(self) -> int:
        """The eager tokens MD takes over once `tokens` are computed: the catch-up chunks' and these."""
        return self.have + len(self.tokens or ())


@dataclass
class Abort:
    req: Any
    held: bool  # True: the KV arrived and the hook holds the request; False: still in sglang's queues
    message: str
    relay_finished: bool  # the relay completed the request itself (not an error)


@dataclass
class MainStats:
    admitted: int = 0
    handoffs: int = 0
    handoff_tokens: int = 0
    relay_finished: int = 0
    failed: int = 0
    ended_by_sglang: int = 0  # admitted or draining entries whose request sglang ended in its queues
    unknown_messages: int = 0
    chunks: int = 0
    chunk_tokens: int = 0
    modes: dict[str, int] = field(default_factory=dict)  # completed handoffs by the relay's chosen mode
    extend_sizes: list[int] = field(default_factory=list)


class MainHandoff:
    def __init__(self, channel: Channel, timeout_s: float, now: Callable[[], float] = time.monotonic,
                 keep_kv_when_relay_finishes: bool = True, mode: str = "adaptive", chunk: int = 32, gap: int = 2,
                 kv_timeout_s: float = 300.0, record: Callable[[str, Any], None] = _ignore):
        self.channel = channel
        self.record = record
        self.mode, self.chunk, self.gap = mode, chunk, gap
        self.keep_kv = keep_kv_when_relay_finishes
        self.timeout_s = timeout_s
        self.kv_timeout_s = kv_timeout_s
        self.now = now
        self.pending: dict[tuple[str, int], Pending] = {}
        self.by_rid: dict[str, tuple[str, int]] = {}
        self.stats = MainStats()

    # -- what the scheduler hook calls -------------------------------------------------------
    def admit(self, req: Any, params: RequestParams, drop_eager_kv: bool = False) -> str | None:
        """Track a relayed request and send `Watch`; the error that ends it instead, if any.
        `drop_eager_kv`: a negative control (test switches only)."""
        key = (params.relay, params.relay_room)
        if key in self.pending:
            return f"pdd: relay room {params.relay_room} of {params.relay} is already being handed over"
        self.pending[key] = Pending(req, params.relay, params.relay_room, since=self.now(),
                                    mode=params.handoff or self.mode, chunk=params.chunk or self.chunk,
                                    drop_eager_kv=drop_eager_kv)
        self.by_rid[req.rid] = key
        self.stats.admitted += 1
        if not self.channel.send(params.relay, Watch(room=params.relay_room)):
            self._forget(key)
            return f"pdd: cannot reach the relay {params.relay}"
        return None

    def is_relayed(self, req: Any) -> bool:
        return req.rid in self.by_rid

    def kv_arrived(self, req: Any, md_batch: int = 0) -> Abort | None:
        """MD's KV landed. Asks the relay for the tokens, or (draining) ends the request, KV kept."""
        p = self.pending[self.by_rid[req.rid]]
        if p.state == DRAINING:
            p.state = WAITING_TOKENS  # it is held now: the abort must release it
            return self._end(p, "pdd: the relay finished this request itself; MD kept its KV",
                             relay_finished=True)
        self._ask(p, md_batch)
        logger.debug("main room %s: KV arrived, asked relay %s for tokens", p.relay_room, p.relay)

    def chunk_done(self, p: Pending, md_batch: int = 0) -> None:
        """A catch-up chunk's EXTEND ran: its KV is in MD's pool; ask for what follows."""
        self.stats.chunks += 1
        self.stats.chunk_tokens += len(p.tokens)
        self.record("chunk", len(p.tokens))
        p.have += len(p.tokens)
        p.tokens = p.logprobs = None
        self._ask(p, md_batch)

    def _ask(self, p: Pending, md_batch: int) -> None:
        p.state, p.since = WAITING_TOKENS, self.now()
        self.channel.send(p.relay, Ready(room=p.relay_room, have=p.have, mode=p.mode,
                                         chunk=0 if p.mode == "one-shot" else p.chunk, gap=self.gap,
                                         md_batch=md_batch))

    def held(self) -> list[Any]:
        """Requests whose KV arrived and that sglang's own queues no longer see."""
        return [p.req for p in self.pending.values() if p.state in HELD]

    def poll(self) -> list[Abort]:
        aborts: list[Abort] = []
        for addr, msg in self.channel.poll():
            p = self.pending.get((addr, msg.room))
            if p is None:
                self.stats.unknown_messages += 1
                self.record("unknown_message", None)
                n = self.stats.unknown_messages
                if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood cannot flood the log
                    logger.warning("token channel: %s for unknown or finished room %s from %s (%d so far)",
                                   type(msg).__name__, msg.room, addr, n)
                continue
            if isinstance(msg, Tokens) and p.state == WAITING_TOKENS:
                if msg.start != p.have or not msg.ids or (not msg.final and p.mode == "one-shot"):
                    aborts.append(self._fail(p, f"relay sent tokens {msg.start}+{len(msg.ids)} final={msg.final}; "
                                                f"expected {p.mode} tokens from {p.have}"))
                else:
                    p.tokens, p.logprobs, p.final, p.state = list(msg.ids), msg.logprobs, msg.final, READY
                    p.since = self.now()
                    p.chosen = msg.mode
            elif isinstance(msg, Finished):
                self.stats.relay_finished += 1
                if p.state == ADMITTED and self.keep_kv:
                    p.state = DRAINING  # let the KV land: the next turn of this conversation hits it
                else:
                    aborts.append(self._end(p, f"pdd: the relay finished this request itself ({msg.reason})",
                                            relay_finished=True))
            elif isinstance(msg, Reject):
                aborts.append(self._fail(p, f"pdd: the relay rejected the handoff: {msg.reason}"))
            else:
                aborts.append(self._fail(p, f"pdd: unexpected {type(msg).__name__} in state {p.state.value}"))
        aborts += self._expire(self.now())
        return aborts

    def _expire(self, now: float) -> list[Abort]:
        """Deadlines of every state; entries whose request sglang ended are forgotten."""
        aborts = []
        for key, p in list(self.pending.items()):
            if p.state in (ADMITTED, DRAINING) and p.req.finished():
                self._forget(key)  # sglang ended it in its own queues (transfer failed, aborted)
                self.stats.ended_by_sglang += 1
            elif p.state in (ADMITTED, DRAINING) and now - p.since > self.kv_timeout_s:
                aborts.append(self._fail(p, f"pdd: the KV did not arrive within {self.kv_timeout_s:g}s"))
            elif p.state == WAITING_TOKENS and now - p.since > self.timeout_s:
                aborts.append(self._fail(p, f"pdd: no eager tokens from the relay within {self.timeout_s:g}s"))
            elif p.state == READY and now - p.since > self.timeout_s:
                aborts.append(self._fail(p, f"pdd: no room for the handoff EXTEND within {self.timeout_s:g}s"))
        return aborts

    def counts(self) -> dict[HandoffState, int]:
        """Entries by state (every state, zeros included)."""
        out = dict.fromkeys(STATES, 0)
        for p in self.pending.values():
            out[p.state] += 1
        return out

    def matching(self, rid: str, abort_all: bool = False) -> list[Pending]:
        """Entries an AbortReq names: every one for abort_all, else those whose rid starts with `rid`
        (sglang's own matching)."""
        return [p for p in self.pending.values() if abort_all or (rid and p.req.rid.startswith(rid))]

    def ready_finals(self) -> int:
        """Final handoffs ready for their EXTEND."""
        return sum(1 for p in self.pending.values() if p.state == READY and p.final)

    def take_ready(self, max_reqs: int, slot_budget: int, solo: Callable[[Any], bool] = lambda req: False,
                   cost: Callable[[Pending], int] = lambda p: len(p.tokens), final: bool = True) -> list[Pending]:
        """Ready requests for one EXTEND batch, oldest first, within the row and KV-slot budgets
        (`cost(p)`: slots its EXTEND allocates): final handoffs (`final`), or catch-up chunks, which
        stay pending (state extending) until `chunk_done`. A final request for which `solo(req)`
        holds gets a batch of its own. What does not fit stays ready for a later iteration."""
        out = []
        if not final:
            for p in self.pending.values():
                if p.state == READY and not p.final and len(out) < max_reqs and cost(p) <= slot_budget:
                    slot_budget -= cost(p)
                    p.state = EXTENDING
                    out.append(p)
            return out
        for key, p in list(self.pending.items()):
            if p.state != READY or not p.final:
                continue
            if len(out) >= max_reqs or cost(p) > slot_budget:
                break
            if solo(p.req) and out:
                break
            slot_budget -= cost(p)
            out.append(p)
            self._forget(key)
            self.stats.handoffs += 1
            self.stats.handoff_tokens += p.handoff_tokens
            self.stats.modes[p.chosen] = self.stats.modes.get(p.chosen, 0) + 1
            self.record("handoff", p.chosen)
            if solo(p.req):
                break
        if out:
            self.stats.extend_sizes.append(len(out))
        return out

    def drop(self, rid: str) -> Any | None:
        """Forget a request (aborted from outside); returns it when the hook was holding it."""
        key = self.by_rid.get(rid)
        if key is None:
            return None
        p = self.pending[key]
        self._forget(key)
        return p.req if p.state in HELD else None

    # -- internals -------------------------------------------------------------------------
    def _fail(self, p: Pending, message: str) -> Abort:
        self.stats.failed += 1
        logger.warning("main room %s (relay room %s): %s", getattr(p.req, "bootstrap_room", "?"), p.relay_room, message)
        return self._end(p, message, relay_finished=False)

    def _end(self, p: Pending, message: str, relay_finished: bool) -> Abort:
        self._forget((p.relay, p.relay_room))
        return Abort(p.req, held=p.state in HELD, message=message, relay_finished=relay_finished)

    def _forget(self, key: tuple[str, int]) -> None:
        p = self.pending.pop(key, None)
        if p is not None:
            self.by_rid.pop(p.req.rid, None)
