"""The decode batch of a P that relays: its relayed requests, one decode step between prefill steps.

After its prefill a relayed request holds its prompt's KV and its first token (P sampled it), exactly the
state sglang's decode server builds for a request whose KV arrived: `join` makes the same "prebuilt" batch
(`ScheduleBatch.prepare_for_prebuilt`), puts the first token where sglang's next decode step reads its
input (the future map's row of the request), and merges it into the running relay batch. `step` is
sglang's own decode preparation (`filter_batch`, `check_decode_mem`, `prepare_for_decode`); the scheduler
runs the batch and sglang's `process_batch_result_decode` appends, streams and finishes its tokens.

A step never allocates past the pool: when the next step does not fit (prefills took the memory), the
batch's requests are parked (`park_all`): they keep their rows and stop decoding, and each hands over the
tokens it has when MD is ready. No OOM, and the prefill queue is never held back for a relay.
"""

from __future__ import annotations

from typing import Any


class RelayBatch:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.batch: Any = None  # the ScheduleBatch of the relayed requests decoding on P, or None
        self.parked: list[Any] = []  # relayed requests that stopped decoding for lack of KV

    # -- requests in --------------------------------------------------------------------------
    def join(self, reqs: list) -> None:
        """Relayed requests whose prefill just finished: they decode from the next step on."""
        import torch
        from sglang.srt.managers.overlap_utils import RelayPayload
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        s = self.s
        new = ScheduleBatch.init_new(reqs, s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache,
                                     s.model_config, s.enable_overlap, s.spec_algorithm)
        new.prepare_for_prebuilt()
        last = torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64, device=new.device)
        s.future_map.stash(new.req_pool_indices, RelayPayload(bonus_tokens=last))
        if self.batch is None or self.batch.is_empty():
            self.batch = new
        else:
            self.batch.merge_batch(new)

    # -- one decode step ----------------------------------------------------------------------
    def step(self) -> Any:
        """The batch ready for its next decode step, or None (nothing to decode, or parked for KV)."""
        b = self.batch
        if b is None:
            return None
        b.filter_batch()  # requests that finished (handoff, EOS, length, abort) leave
        if b.is_empty():
            self.batch = None
            return None
        if not b.check_decode_mem():
            self.park_all()
            return None
        b.prepare_for_decode()
        return b

    def park_all(self) -> None:
        self.parked.extend(r for r in self.batch.reqs if not r.finished())
        self.batch = None

    # -- what the handoff asks ----------------------------------------------------------------
    def has(self, req: Any) -> bool:
        return (self.batch is not None and any(r is req for r in self.batch.reqs)) or any(r is req for r in self.parked)

    def drop_parked(self, req: Any) -> None:
        self.parked = [r for r in self.parked if r is not req]

    def decoding(self) -> int:
        return 0 if self.batch is None else len(self.batch.reqs)

    def __len__(self) -> int:
        return self.decoding() + len(self.parked)
