"""The deployments the simulator compares (issue 8 item 1, "Policies").

| name             | P   | RLD | D / MD            | KV over the WAN          | routing              |
|------------------|-----|-----|-------------------|--------------------------|----------------------|
| same-dc-pd       | A   | -   | D, same site      | none (RDMA, full KV)     | -                    |
| xdc-pd-naive     | A   | -   | D, remote site    | full prompt KV           | -                    |
| xdc-pd-drc       | A   | -   | MD, remote, DRC   | missed KV only           | -                    |
| pdd-one-shot     | A   | A   | MD, remote, DRC   | missed KV only           | MD hit >= threshold  |
| pdd-catch-up     | A   | A   | MD, remote, DRC   | missed KV only           | MD hit >= threshold  |
| pdd-adaptive     | A   | A   | MD, remote, DRC   | missed KV only           | MD hit >= threshold  |
| pdd-relay-only   | A   | A   | MD, remote, DRC   | missed KV only           | + P->RLD for low hit |
| pdd-bw (ours)    | A   | A   | MD, remote, DRC   | missed KV only           | predicted WAN time   |
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Optional

from sglang_pdd.policy.handoff_mode import HandoffModeConfig, HandoffPolicyKind
from sglang_pdd.policy.pipeline import RouteBy
from sglang_pdd.lab.sim.hardware import CHIP_A, CHIP_B, Chip
from sglang_pdd.lab.sim.wan import WanSpec


class Arch(str, enum.Enum):
    PD = "pd"  # P -> D (same site, or D remote when `wan` is set)
    PDD = "pdd"  # P -> {RLD, MD}


@dataclass(frozen=True)
class PoolSpec:
    chip: Chip
    instances: int
    chips_per_instance: int = 8
    max_batch: Optional[int] = None  # None: derived from the TPOT SLA and KV capacity

    @property
    def chips(self) -> int:
        return self.instances * self.chips_per_instance

    @property
    def price_per_hour(self) -> float:
        return self.chips * self.chip.price_per_hour


@dataclass(frozen=True)
class RoutingSpec:
    md_choice: str = "cache-aware"  # the router's choice of MD (policy.peer_choice.POLICIES)
    route_by: RouteBy = RouteBy.HIT_THRESHOLD
    hit_threshold: float = 0.95
    wan_budget_s: float = 1.0
    odd_output_threshold: int = 500
    allow_relay_only: bool = False
    relay_only_below_hit: float = 0.9
    relay_only_max_rld_usage: float = math.inf


@dataclass(frozen=True)
class SystemSpec:
    name: str
    arch: Arch
    prefill: PoolSpec
    decode: PoolSpec  # D for PD, MD for PDD
    relay: Optional[PoolSpec] = None
    wan: Optional[WanSpec] = None  # None: D in the same datacenter as P
    drc: bool = False  # decode-side radix cache on D/MD
    drc_capacity_tokens: int = 40_000_000  # per D/MD instance (HBM left over + host DRAM tier)
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    handoff: HandoffModeConfig = field(default_factory=HandoffModeConfig)
    chunk_size: int = 8192
    tail_chunk_batching: bool = False
    rdma_gbps: float = 400.0  # intra-DC fast path per transfer
    rdma_latency_s: float = 0.005
    rld_eager_reserve_tokens: int = 512  # RLD reserves prompt + this, not the whole output
    max_catch_up_rounds: int = 4
    align_md_cache: bool = True  # a relayed request RLD finishes still lands its prompt on MD
    wan_price_per_hour: float = 0.0  # dedicated line, same units as chip prices

    def __post_init__(self) -> None:
        if self.arch is Arch.PDD and (self.relay is None or self.wan is None):
            raise ValueError(f"{self.name}: PDD needs a relay pool and a WAN")

    @property
    def pools(self) -> dict[str, PoolSpec]:
        d = {"P": self.prefill, "MD" if self.arch is Arch.PDD else "D": self.decode}
        if self.relay is not None:
            d["RLD"] = self.relay
        return d

    @property
    def price_per_hour(self) -> float:
        return sum(p.price_per_hour for p in self.pools.values()) + self.wan_price_per_hour

    def chips_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pools.values():
            out[p.chip.name] = out.get(p.chip.name, 0) + p.chips
        return out

    def chips_label(self) -> str:
        return " + ".join(f"{n} x {k}" for k, n in sorted(self.chips_by_kind().items()))

    def with_pools(self, **pools: PoolSpec) -> "SystemSpec":
        return replace(self, **pools)


def make_system(name: str, p: PoolSpec, d: PoolSpec, rld: Optional[PoolSpec] = None,
                wan: Optional[WanSpec] = None, **kw) -> SystemSpec:
    """Build one of the named deployments (module docstring) from its pools."""
    wan = wan or WanSpec()
    hk = HandoffModeConfig
    table = {
        "same-dc-pd": dict(arch=Arch.PD, wan=None, drc=False),
        "xdc-pd-naive": dict(arch=Arch.PD, wan=wan, drc=False),
        "xdc-pd-drc": dict(arch=Arch.PD, wan=wan, drc=True),
        "pdd-one-shot": dict(arch=Arch.PDD, wan=wan, drc=True, handoff=hk(HandoffPolicyKind.ONE_SHOT)),
        "pdd-catch-up": dict(arch=Arch.PDD, wan=wan, drc=True, handoff=hk(HandoffPolicyKind.CATCH_UP)),
        "pdd-adaptive": dict(arch=Arch.PDD, wan=wan, drc=True, handoff=hk(HandoffPolicyKind.ADAPTIVE)),
        "pdd-relay-only": dict(arch=Arch.PDD, wan=wan, drc=True, handoff=hk(HandoffPolicyKind.ADAPTIVE),
                               routing=RoutingSpec(allow_relay_only=True)),
        "pdd-bw": dict(arch=Arch.PDD, wan=wan, drc=True, handoff=hk(HandoffPolicyKind.ADAPTIVE),
                       routing=RoutingSpec(route_by=RouteBy.BANDWIDTH, wan_budget_s=0.25)),
    }
    if name not in table:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(table)}")
    args = dict(table[name])
    if args["arch"] is Arch.PD:
        rld = None
    args.update(kw)
    return SystemSpec(name=name, prefill=p, decode=d, relay=rld, **args)


SYSTEM_NAMES = ("same-dc-pd", "xdc-pd-naive", "xdc-pd-drc", "pdd-one-shot", "pdd-catch-up",
                "pdd-adaptive", "pdd-relay-only", "pdd-bw")


def paper_baseline(p_instances: int = 5, d_instances: int = 6) -> SystemSpec:
    """The paper scenario's baseline (docs/sim.md §3): 88 x A in one site (8-chip instances)."""
    return make_system("same-dc-pd", PoolSpec(CHIP_A, p_instances), PoolSpec(CHIP_A, d_instances))


def paper_pdd(name: str = "pdd-bw", p_instances: int = 5, rld_chips: int = 4,
              md_instances: int = 4, wan: Optional[WanSpec] = None) -> SystemSpec:
    """The paper scenario's shape (docs/sim.md §3): A for P and RLD, B for MD (paper: 43 x A + 32 x B)."""
    return make_system(name, PoolSpec(CHIP_A, p_instances), PoolSpec(CHIP_B, md_instances),
                       rld=PoolSpec(CHIP_A, 1, chips_per_instance=rld_chips), wan=wan)
