"""A prefill instance: FIFO chunked prefill under a token budget, with the tail-chunk effect.

Each step takes up to `chunk_size` new tokens from the head of the queue. A request whose
remaining tokens exceed the budget fills it (one full chunk). A request that fits in one chunk
shares the step with the next ones. The last, partial chunk of a multi-chunk request (its
*tail chunk*) runs alone unless `tail_chunk_batching` is on: this is the effect docs/sim.md traces
the bathtub's sudden drops to (small steps cannot amortise weight reads and step overhead).

KV memory: a request holds its whole prompt's KV from its first chunk until the cluster releases
it (after its transfers), so a slow WAN backs up into prefill.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.engine import EventLoop


class PrefillJob:
    __slots__ = ("key", "input_len", "new_tokens", "prefix", "done", "allocated")

    def __init__(self, key: Any, input_len: int, prefix: int):
        self.key, self.input_len, self.prefix = key, input_len, prefix
        self.new_tokens = max(1, input_len - prefix)
        self.done, self.allocated = 0, False


class PrefillInstance:
    def __init__(self, loop: EventLoop, cost: CostModel, name: str, chunk_size: int,
                 tail_chunk_batching: bool, on_prefilled: Callable[[Any], None]):
        self.loop, self.cost, self.name = loop, cost, name
        self.chunk_size, self.tail_chunk_batching = chunk_size, tail_chunk_batching
        self.on_prefilled = on_prefilled
        self.queue: deque[PrefillJob] = deque()
        self.capacity = cost.kv_capacity_tokens
        self.used = 0
        self.busy = False
        self.busy_s = 0.0
        self.queued_tokens = 0
        self.steps = 0

    def submit(self, job: PrefillJob) -> None:
        if job.input_len > self.capacity:
            raise ValueError(f"{self.name}: prompt of {job.input_len} tokens exceeds KV pool")
        self.queue.append(job)
        self.queued_tokens += job.new_tokens
        self._kick()

    def release(self, job: PrefillJob) -> None:
        self.used -= job.input_len
        self._kick()

    def _kick(self) -> None:
        if not self.busy and self.queue:
            self._step()

    def _plan(self) -> list[tuple[PrefillJob, int]]:
        plan: list[tuple[PrefillJob, int]] = []
        budget = self.chunk_size
        for job in self.queue:
            if budget <= 0:
                break
            if not job.allocated:
                if self.used + job.input_len > self.capacity:
                    break
                self.used += job.input_len
                job.allocated = True
            rem = job.new_tokens - job.done
            if rem > budget:
                plan.append((job, budget))
                break
            is_tail = job.done > 0
            if is_tail and plan and not self.tail_chunk_batching:
                break  # the tail chunk waits for a step of its own
            plan.append((job, rem))
            budget -= rem
            if is_tail and not self.tail_chunk_batching:
                break
        return plan

    def _step(self) -> None:
        plan = self._plan()
        if not plan:
            return  # stalled on KV memory; release() kicks again
        self.busy = True
        dt = self.cost.prefill_step_s([Chunk(n, j.prefix + j.done) for j, n in plan])
        self.busy_s += dt
        self.loop.after(dt, self._step_done, plan)

    def _step_done(self, plan: list[tuple[PrefillJob, int]]) -> None:
        self.busy = False
        self.steps += 1
        finished = []
        for job, n in plan:
            job.done += n
            self.queued_tokens -= n
            if job.done >= job.new_tokens:
                finished.append(job)
        for job in finished:
            self.queue.remove(job)
        for job in finished:
            self.on_prefilled(job.key)
        self._kick()
