"""One KV pool for a P and the relay side co-located on it (`never_lose`).

§7's co-located relay takes a static share of P's KV pool. Here the two sides share it, as
sglang's PD multiplexing runs prefill and decode in one scheduler over one pool: P's free KV is
the pool less both sides' use, and freeing either side lets the other go on.
"""

from __future__ import annotations

from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.prefill import PrefillInstance, PrefillJob


class PooledPrefill(PrefillInstance):
    """A P whose KV pool its co-located relay side shares: free = pool - both sides' use."""

    relay: DecodeInstance
    pool_tokens: int

    @property
    def capacity(self) -> int:
        return self.pool_tokens - self.relay.used

    @capacity.setter
    def capacity(self, v: int) -> None:
        self.pool_tokens = v

    def submit(self, job: PrefillJob) -> None:
        if job.input_len > self.pool_tokens:
            raise ValueError(f"{self.name}: prompt of {job.input_len} tokens exceeds KV pool")
        self.queue.append(job)
        self.queued_tokens += job.new_tokens
        self._kick()

    def release(self, job: PrefillJob) -> None:
        super().release(job)
        self.relay._try_admit()


class PooledRelay(DecodeInstance):
    """The relay side of a P: it reserves from the P's own KV pool."""

    host: PooledPrefill

    @property
    def capacity(self) -> int:
        return self.host.pool_tokens - self.host.used

    @capacity.setter
    def capacity(self, v: int) -> None:
        pass  # the host's pool decides

    def admit(self, key, reserve_tokens, on_admitted) -> None:
        if reserve_tokens > self.host.pool_tokens:
            raise ValueError(f"{self.name}: reservation {reserve_tokens} exceeds KV pool")
        self.waiting.append((key, reserve_tokens, on_admitted))
        self._try_admit()

    def release(self, key) -> None:
        super().release(key)
        self.host._kick()


def pool_memory(p: PrefillInstance, r: DecodeInstance, tokens: int) -> None:
    """Turn a P and its co-located relay side into one KV pool of `tokens` (as sglang's PD
    multiplexing runs prefill and decode in one scheduler over one KV pool)."""
    p.__class__, r.__class__ = PooledPrefill, PooledRelay
    p.__dict__.pop("capacity", None)
    r.__dict__.pop("capacity", None)
    p.relay, r.host, p.pool_tokens = r, p, tokens
