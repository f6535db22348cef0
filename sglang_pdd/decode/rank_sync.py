"""TP > 1 on the decode roles: rank 0 decides, the other TP ranks replay its decisions.

Every TP rank of a decode server runs sglang's scheduler over the same requests (rank 0 reads them and
broadcasts them) and must build the same batches, or the ranks' collectives stop matching. The token
channel, the handoff state machines and every PDD decision live on TP rank 0 (`RelayRuntime`,
`MainRuntime`). Each decision that changes what sglang's queues or batches hold is an op below; rank 0
broadcasts an iteration's ops over the TP CPU group at fixed points that every rank reaches in the same
order (sglang's loop is in lockstep: each iteration starts with the request broadcast):

    admit      each request sglang queued (all ranks admit the same requests in the same order): Refuse
    poll       after process_decode_queue: Hold, Abort (MD), Finish (RLD), and rank 0's `busy`
    select     MD's batch selection: Extend (the handoff or catch-up EXTEND over given token IDs)

The followers (`main.follower.MainFollower`, `relay.follower.RelayFollower`) apply them to their own
`Req` objects, found by rid. With TP 1 nothing is exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERSION = 1


@dataclass(frozen=True)
class Refuse:
    """Rank 0 ended a request at admission (`request_errors.end_queued`)."""

    rid: str
    message: str
    status_code: int


@dataclass(frozen=True)
class Hold:
    """MD: the request's KV landed; it leaves sglang's waiting queue and is held for the relay's tokens."""

    rid: str


@dataclass(frozen=True)
class Abort:
    """MD ended a request: `held` (only the plugin sees it) or still in sglang's queues (its abort path)."""

    rid: str
    held: bool
    message: str
    relay_finished: bool
    keep_kv: bool = True


@dataclass(frozen=True)
class Finish:
    """RLD ended a request with the handoff finish after `handoff_tokens` eager tokens."""

    rid: str
    handoff_tokens: int
    mode: str


@dataclass(frozen=True)
class ExtendItem:
    rid: str
    have: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] | None


@dataclass(frozen=True)
class Extend:
    """MD's EXTEND of this selection: `final` (handoff) or catch-up chunks."""

    final: bool
    items: tuple[ExtendItem, ...]


@dataclass
class Round:
    """One broadcast: the ops of one sync point, with rank 0's view of whether the role is busy."""

    ops: list = field(default_factory=list)
    busy: bool = False
    v: int = VERSION


class RankSync:
    """The broadcast of one scheduler's TP group; `active` only with TP > 1."""

    def __init__(self, scheduler: Any) -> None:
        self.group = getattr(scheduler, "tp_group", None)
        self.active = int(getattr(scheduler, "tp_size", 1) or 1) > 1 and self.group is not None
        self.leader = not self.active or self.group.rank == self.group.ranks[0]
        self.pending: list = []  # rank 0: the ops recorded since the last poll-point round

    def record(self, op: Any) -> None:
        """Rank 0: an op for the next poll-point round (nothing is kept with TP 1)."""
        if self.active:
            self.pending.append(op)

    def flush(self, busy: bool = False) -> None:
        """Rank 0 at the poll point: send the ops recorded since the last one, with the role's `busy`."""
        if self.active:
            ops, self.pending = self.pending, []
            self.exchange(Round(ops=ops, busy=busy))

    def exchange(self, sent: Round | None = None) -> Round:
        """Rank 0 sends `sent` (and gets it back); every other rank gets rank 0's. All ranks must call."""
        if not self.active:
            return sent or Round()
        from sglang.srt.utils.common import broadcast_pyobj

        data = broadcast_pyobj([sent] if self.leader else [], self.group.rank, self.group.cpu_group,
                               src=self.group.ranks[0])
        got = data[0] if data else Round()
        if got.v != VERSION:
            raise RuntimeError(f"sglang-pdd: TP rank 0 speaks rank-sync v{got.v}, this rank v{VERSION}")
        return got
