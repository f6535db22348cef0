"""A decode instance (same-DC D, RLD or MD): continuous batching plus handoff EXTEND steps.

* Admission: FIFO; a request is admitted when the batch has room (`max_batch`) and the KV pool
  can hold its reservation. The reservation is made before its KV is transferred (as upstream
  PD pre-allocates on the decode side) and released when the request leaves.
* A decode step produces one token for every running request; its time comes from the roofline
  with the batch's total KV tokens, which grows by one token per request per step. Per-request
  work is O(1) per step: the instance keeps a step counter and each request remembers the step
  it joined at, so "tokens produced here" is `steps - join_step`.
* EXTEND (MD recomputing eager tokens from their IDs) runs as a separate forward between decode
  steps, so the whole running batch waits for it: the one-shot "hiccup".
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable

from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.engine import EventLoop


class _Running:
    __slots__ = ("key", "join_step", "ctx_join", "finish_step", "on_finish")

    def __init__(self, key: Any, join_step: int, ctx_join: int, finish_step: int,
                 on_finish: Callable[[Any], None]):
        self.key, self.join_step, self.ctx_join = key, join_step, ctx_join
        self.finish_step, self.on_finish = finish_step, on_finish


class DecodeInstance:
    def __init__(self, loop: EventLoop, cost: CostModel, name: str, max_batch: int):
        self.loop, self.cost, self.name = loop, cost, name
        self.capacity = cost.kv_capacity_tokens
        self.max_batch = max_batch
        self.used = 0
        self.reserved: dict[Any, int] = {}
        self.waiting: deque[tuple[Any, int, Callable[[Any], None]]] = deque()
        self.running: dict[Any, _Running] = {}
        self._finish_heap: list[tuple[int, int, Any]] = []
        self._seq = 0
        self.steps = 0
        self.ctx_base = 0  # sum over running of (ctx_join - join_step)
        self.busy = False
        self.busy_s = 0.0
        self.extends: list[tuple[Any, Chunk, Callable[[Any], None]]] = []
        self.tokens_out = 0
        self.batch_steps = 0  # sum of batch sizes over steps (for mean batch)
        self.extend_steps = 0

    # ----- load signals -----
    @property
    def kv_usage(self) -> float:
        return self.used / self.capacity

    @property
    def occupancy(self) -> float:
        """The binding one of KV usage and batch-slot usage, 0..1 (waiting requests push it
        above 1)."""
        return max(self.kv_usage, (len(self.reserved) + len(self.waiting)) / self.max_batch)

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.reserved)

    # ----- admission -----
    def admit(self, key: Any, reserve_tokens: int, on_admitted: Callable[[Any], None]) -> None:
        if reserve_tokens > self.capacity:
            raise ValueError(f"{self.name}: reservation {reserve_tokens} exceeds KV pool")
        self.waiting.append((key, reserve_tokens, on_admitted))
        self._try_admit()

    def withdraw(self, key: Any) -> bool:
        """Drop a request still waiting for admission; True if it was waiting."""
        for i, (k, _, _) in enumerate(self.waiting):
            if k == key:
                del self.waiting[i]
                return True
        return False

    def _try_admit(self) -> None:
        while self.waiting:
            key, need, cb = self.waiting[0]
            if len(self.reserved) >= self.max_batch or self.used + need > self.capacity:
                return
            self.waiting.popleft()
            self.used += need
            self.reserved[key] = need
            cb(key)

    def release(self, key: Any) -> None:
        """Drop a request's reservation (and its place in the batch, if running)."""
        self.leave(key)
        need = self.reserved.pop(key, 0)
        self.used -= need
        self._try_admit()

    # ----- running batch -----
    def join(self, key: Any, context_tokens: int, tokens_to_generate: int,
             on_finish: Callable[[Any], None]) -> None:
        """Start decoding an admitted request: it generates `tokens_to_generate` tokens."""
        join_step = self.steps + (1 if self.busy else 0)
        r = _Running(key, join_step, context_tokens, join_step + tokens_to_generate, on_finish)
        self.running[key] = r
        self.ctx_base += context_tokens - join_step
        self._seq += 1
        heapq.heappush(self._finish_heap, (r.finish_step, self._seq, key))
        self._kick()

    def produced(self, key: Any) -> int:
        r = self.running.get(key)
        return 0 if r is None else max(0, self.steps - r.join_step)

    def leave(self, key: Any) -> int:
        """Stop decoding `key` now; returns the tokens it produced here. Keeps the reservation."""
        r = self.running.pop(key, None)
        if r is None:
            return 0
        self.ctx_base -= r.ctx_join - r.join_step
        return max(0, self.steps - r.join_step)

    def extend(self, key: Any, chunk: Chunk, on_done: Callable[[Any], None]) -> None:
        self.extends.append((key, chunk, on_done))
        self._kick()

    def _kick(self) -> None:
        if not self.busy and (self.running or self.extends):
            self._step()

    def _step(self) -> None:
        self.busy = True
        if self.extends:
            batch, self.extends = self.extends, []
            dt = self.cost.extend_s([c for _, c, _ in batch])
            self.extend_steps += 1
            self.busy_s += dt
            self.loop.after(dt, self._extend_done, batch)
            return
        n = len(self.running)
        ctx = self.ctx_base + n * self.steps
        dt = self.cost.decode_step_s(n, ctx)
        self.busy_s += dt
        self.loop.after(dt, self._decode_done, n)

    def _extend_done(self, batch: list) -> None:
        self.busy = False
        for key, _, cb in batch:
            cb(key)
        self._kick()

    def _decode_done(self, n: int) -> None:
        self.busy = False
        self.steps += 1
        self.tokens_out += n
        self.batch_steps += n
        heap = self._finish_heap
        while heap and heap[0][0] <= self.steps:
            _, _, key = heapq.heappop(heap)
            r = self.running.get(key)
            if r is None or r.finish_step > self.steps:
                continue  # left earlier (handoff) or stale entry
            self.leave(key)
            r.on_finish(key)
        self._kick()
