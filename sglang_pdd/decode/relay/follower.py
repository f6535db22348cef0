"""RelayDecode on a TP rank other than 0: replays rank 0's handoff finishes (rank_sync).

Rank 0's `RelayRuntime` owns the token channel and decides; this rank ends the same requests with
the same finish at the same point of the same iteration, so both ranks' batches stay equal."""

from __future__ import annotations

from typing import Any

from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.decode.rank_sync import Finish, RankSync
from sglang_pdd.decode.relay.runtime import end_with_handoff


class RelayFollower(DecodeRole):
    role = "relay"

    def __init__(self, scheduler: Any, sync: RankSync) -> None:
        super().__init__(scheduler)
        self.sync = sync

    def poll(self) -> None:
        s = self.scheduler
        for op in self.sync.exchange().ops:
            if not isinstance(op, Finish):
                raise RuntimeError(f"sglang-pdd: a relay follower got {type(op).__name__} from rank 0")
            req = next((r for r in [*s.running_batch.reqs, *s.waiting_queue] if r.rid == op.rid), None)
            if req is None:
                raise RuntimeError(f"sglang-pdd: TP ranks disagree: request {op.rid} is not decoding here")
            end_with_handoff(s, req, op.handoff_tokens, op.mode)

    def _publish(self, now: float) -> None:
        """Rank 0 publishes the gauges."""
