"""Co-located RLD: relay decode runs on the P instances; no dedicated relay pool.

Each P instance hosts one RLD decode instance and a relayed request decodes on the P that
prefilled it. The P's resources are split:

* memory, statically (as sglang's memory fraction is fixed at start-up): `share` of P's KV pool
  goes to the decode side, whether or not it relays;
* compute, while the decode side has running requests (an SM partition, e.g. green contexts):
  prefill steps take `1 / (1 - share)` as long, times `1 + interference` for what a partition
  does not isolate (HBM and L2 contention, interleaved launches). The decode side runs at
  `share` of the MFU and at MBU / (1 + interference).

The KV still moves P -> RLD by the intra-DC fast path (pessimistic: it is the same HBM). The
bill counts the P and MD pools only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar, Sequence

from sglang_pdd.lab.sim.cluster import Cluster, pool_cost
from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec


class SharedPrefillCost:
    """A P instance's cost model, slowed by `factor` while its co-located decode runs."""

    def __init__(self, cost: CostModel, relay: DecodeInstance, factor: float):
        self.cost, self.relay, self.factor = cost, relay, factor
        self.kv_capacity_tokens = cost.kv_capacity_tokens
        self.slowed_steps = 0

    def prefill_step_s(self, chunks: Sequence[Chunk]) -> float:
        t = self.cost.prefill_step_s(chunks)
        if self.relay.running:
            self.slowed_steps += 1
            return t * self.factor
        return t

    def __getattr__(self, name: str):
        return getattr(self.cost, name)


class ColocatedCluster(Cluster):
    """`Cluster` with RLD instance i on P instance i."""

    def __init__(self, spec, model, eff, *a, **kw):
        if not 0.0 < spec.share < 1.0:
            raise ValueError(f"{spec.name}: share must be in (0, 1)")
        super().__init__(spec, model, eff, *a, **kw)
        if len(self.R) != len(self.P):
            raise ValueError(f"{spec.name}: one RLD per P instance")
        for p, r in zip(self.P, self.R):
            side = int(p.capacity * spec.share)
            r.capacity = side
            p.capacity -= side
            p.cost = SharedPrefillCost(p.cost, r, spec.prefill_factor)

    def _relay_cost(self, model, pool, eff) -> CostModel:
        s = self.spec
        shared = replace(eff, mfu=eff.mfu * s.share, mbu=eff.mbu / (1.0 + s.interference))
        return pool_cost(model, pool, shared)

    def _pick_rld(self, st) -> int:
        return st.p


@dataclass(frozen=True)
class ColocatedRelaySpec(SystemSpec):
    """A PDD system whose `relay` pool is the decode side of each P instance."""

    share: float = 0.2  # of each P's KV memory (always) and compute (while decoding)
    interference: float = 0.1  # extra prefill slowdown while decode runs beside it

    cluster_class: ClassVar[type] = ColocatedCluster

    @property
    def prefill_factor(self) -> float:
        return (1.0 + self.interference) / (1.0 - self.share)

    @property
    def pools(self) -> dict[str, PoolSpec]:
        return {"P": self.prefill, "MD": self.decode}  # the relay lives on P: no extra bill


def colocated_system(base: SystemSpec, name: str = "pdd-colocated", **kw) -> ColocatedRelaySpec:
    """`base` (a PDD spec: its routing and handoff) with its relay on its P instances."""
    args = {f.name: getattr(base, f.name) for f in fields(SystemSpec)}
    p = base.prefill
    args.update(name=name, relay=PoolSpec(p.chip, p.instances, p.chips_per_instance))
    return ColocatedRelaySpec(**args, **kw)
