"""A relay that decodes on its P through P's own batches, prefill first (`pdd-never-lose`'s default).

§7's co-located relay splits P's compute (an SM partition): while the relay side decodes, every
prefill step takes `prefill_factor` (1.375x) as long, whatever P's queue. Here the relay side is
P's own scheduler decoding the relayed requests in the batches it runs anyway, as sglang's
mixed chunked prefill (`--enable-mixed-chunk`) puts running decode requests into a prefill
step's batch:

* while P has a prefill step to run, the relayed requests' next tokens ride on it: the step
  takes its prefill time plus one decode step of the relay's batch (pessimistic: the weights
  are already read for the prefill, only the relay's KV and its few tokens are extra), and a
  relayed token comes out when the step ends;
* while P is idle, the relay's batch decodes at P's full speed (its own decode steps).

So P is slowed only by the relay's decode work (on the paper's setting one decode step adds 5-8 %
to a 145 ms prefill step, `mixed_slowdown`), not by a fixed 37.5 %, and a relayed request's tokens
slow down while its P is busy; it keeps its first token (P computed it) and MD takes over as before.
Memory: the relay shares P's KV pool (`shared_kv_pool`).
"""

from __future__ import annotations

from typing import Sequence

from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.prefill import PrefillInstance


class MixedPrefillCost:
    """P's cost model: a prefill step carries the relay side's decode step when it has one."""

    def __init__(self, cost: CostModel, relay: DecodeInstance, loop: EventLoop):
        self.cost, self.relay, self.loop = cost, relay, loop
        self.kv_capacity_tokens = cost.kv_capacity_tokens
        self.step_end = float("-inf")  # when P's step in flight ends
        self.slowed_steps = 0

    def prefill_step_s(self, chunks: Sequence[Chunk]) -> float:
        t = self.cost.prefill_step_s(chunks)
        r = self.relay
        if r.running:
            n = len(r.running)
            t += self.cost.decode_step_s(n, r.ctx_base + n * r.steps)
            self.slowed_steps += 1
        self.step_end = self.loop.now + t
        return t

    def __getattr__(self, name: str):
        return getattr(self.cost, name)


class RidingRelayCost:
    """The relay side's cost model: a decode step while P runs a step ends with P's step."""

    def __init__(self, cost: CostModel, p: PrefillInstance, loop: EventLoop):
        self.cost, self.p, self.loop = cost, p, loop
        self.kv_capacity_tokens = cost.kv_capacity_tokens

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        own = self.cost.decode_step_s(batch, context_tokens)
        if self.p.busy:
            return max(own, self.p.cost.step_end - self.loop.now)
        return own

    def __getattr__(self, name: str):
        return getattr(self.cost, name)


def mixed_slowdown(p_cost: CostModel, chunk_size: int, context_tokens: int) -> float:
    """How much longer P's step is with one relayed request's decode riding on it: what a deployment
    measures once (P's step time with and without), and what the headroom rule reads."""
    prefill = p_cost.prefill_step_s([Chunk(chunk_size, 0)])
    return (prefill + p_cost.decode_step_s(1, context_tokens)) / prefill


def ride_on_prefill(p: PrefillInstance, relay: DecodeInstance, p_cost: CostModel, loop: EventLoop) -> None:
    """Make `relay` decode through `p`'s batches; `p_cost` is P's own (unslowed) cost model."""
    p.cost = MixedPrefillCost(p_cost, relay, loop)
    relay.cost = RidingRelayCost(p_cost, p, loop)
