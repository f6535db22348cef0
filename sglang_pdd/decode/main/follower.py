"""MainDecode on a TP rank other than 0: replays rank 0's decisions (rank_sync).

Rank 0's `MainRuntime` owns the token channel and the handoff state machine; this rank holds, ends
and extends the same requests at the same points of the same iteration, with the token IDs rank 0
received, so every rank builds the same batches (the handoff EXTEND included)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.decode.main import extend_batch
from sglang_pdd.decode.main.handoff_attention import ATTENTION, HandoffAttention
from sglang_pdd.decode.main.runtime import chunk_key, end_request
from sglang_pdd.decode.rank_sync import Abort, Extend, Hold, RankSync, Refuse
from sglang_pdd.decode.request_errors import end_queued


def _disagree(what: str) -> RuntimeError:
    return RuntimeError(f"sglang-pdd: TP ranks disagree: {what}")


class MainFollower(DecodeRole):
    role = "main"

    def __init__(self, scheduler: Any, sync: RankSync, attention: HandoffAttention = ATTENTION) -> None:
        super().__init__(scheduler)
        self.sync, self.attention = sync, attention
        self.held: dict[str, Any] = {}  # rid -> Req: the KV landed, waiting for rank 0's Extend
        self.last_extend = None
        self._chunks: dict[tuple[int, ...], list] = {}
        self._leader_busy = False

    def admit(self, req: Any) -> None:
        for op in self.sync.exchange().ops:
            if not isinstance(op, Refuse) or op.rid != req.rid:
                raise _disagree(f"admitting {req.rid}, rank 0 sent {op}")
            end_queued(req, op.message, op.status_code)

    def poll(self) -> None:
        got = self.sync.exchange()
        self._leader_busy = got.busy
        s = self.scheduler
        for op in got.ops:
            if isinstance(op, Hold):
                req = next((r for r in s.waiting_queue if r.rid == op.rid), None)
                if req is None:
                    raise _disagree(f"request {op.rid} is not in this rank's waiting queue")
                s.waiting_queue = [r for r in s.waiting_queue if r is not req]
                self.held[op.rid] = req
            elif isinstance(op, Abort):
                req = self.held.pop(op.rid, None) if op.held else SimpleNamespace(rid=op.rid)
                if req is None:
                    raise _disagree(f"held request {op.rid} is not held here")
                end_request(s, req, op.held, op.message, op.relay_finished, op.keep_kv)
            else:
                raise _disagree(f"unexpected {type(op).__name__} after process_decode_queue")

    def next_batch(self, running_batch: Any) -> tuple[Any, Any]:
        self.attention.disarm()
        ops = self.sync.exchange().ops
        if self.last_extend is not None:
            running_batch, self.last_extend = extend_batch.merged(running_batch, self.last_extend), None
        if not ops:
            return None, running_batch
        op = ops[0]
        if not isinstance(op, Extend):
            raise _disagree(f"unexpected {type(op).__name__} at batch selection")
        items = []
        for it in op.items:
            if it.rid not in self.held:
                raise _disagree(f"request {it.rid} of rank 0's EXTEND is not held here")
            items.append(SimpleNamespace(req=self.held[it.rid], have=it.have, tokens=list(it.tokens),
                                         logprobs=list(it.logprobs) if it.logprobs else None, drop_eager_kv=False))
        batch = extend_batch.build(self.scheduler, items, final=op.final)
        if op.final:
            for it in op.items:
                del self.held[it.rid]
            self.last_extend = batch
        else:
            self._chunks[chunk_key(batch)] = items
        self.attention.arm(batch, batch.batch_size())  # the caller prepares it for DP attention, as on rank 0
        return batch, running_batch

    def on_batch_result(self, batch: Any, result: Any) -> bool:
        """A catch-up chunk's result: its token is dropped, as on rank 0."""
        self.attention.disarm(batch)
        if batch is None or self._chunks.pop(chunk_key(batch), None) is None:
            return False
        copy_done = getattr(result, "copy_done", None)
        if copy_done is not None:
            copy_done.synchronize()
        return True

    def busy(self) -> bool:
        return self._leader_busy or bool(self.held) or self.last_extend is not None or bool(self._chunks)

    def on_abort_request(self, rid: str, message: str | None, abort_all: bool = False) -> None:
        """Held requests are ended by rank 0's Abort ops (sglang's abort reached every rank's queues)."""

    def _publish(self, now: float) -> None:
        """Rank 0 publishes the gauges."""
