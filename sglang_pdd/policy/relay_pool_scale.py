"""The elastic relay pool's scale signal: how many relay instances the deployment should have up.

Pure, over what a deployment observes (`policy.relay_placement` marks each request at risk or not).
An instance costs `instance_price` an hour while it is up (starting included); the rest of the
deployment costs `base_price`. BCR is goodput over the bill, so an instance pays when the goodput it
adds, as a share, is at least the share it adds to the bill: dg / g >= c / C. The goodput a relay can
add is the requests it saves from a TTFT miss, so the pool pays while the share of recent requests at
risk is at least c / C (for the first instance of the paper deployment, 8 / 72 = 11 %):

* at least that share at risk: one instance at least, one more while the ones up are more than
  `busy_share` occupied (up to `max_instances`);
* under half of it: none (the caller holds an instance for a stabilisation window before it leaves,
  as a Kubernetes HPA's scale-down window does, so a pool whose relaying relieved the line does not
  leave at the first quiet minute and come back at the next);
* in between: as many as now (hysteresis).

With no request at risk the target is `min_instances` (0 by default): the bill is xdc-pd-drc's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolScaleConfig:
    instance_price: float  # per hour, one relay instance
    base_price: float  # per hour, the rest of the deployment (P, MD)
    min_instances: int = 0
    max_instances: int = 2
    busy_share: float = 0.8  # add an instance when the ones up are this occupied

    def __post_init__(self) -> None:
        if (self.instance_price <= 0 or self.base_price <= 0 or not 0 <= self.min_instances <= self.max_instances
                or not 0 < self.busy_share <= 1):
            raise ValueError(f"invalid pool scale config {self}")


@dataclass(frozen=True)
class PoolScaleInputs:
    requests: int  # routed over the recent window
    at_risk: int  # of which at risk (`PlacementDecision.at_risk`)
    instances: int  # up or starting
    occupancy: float  # the serving instances' mean occupancy, 0..1 (batch slots or KV, the binding one)


def pays_share(cfg: PoolScaleConfig, instances: int) -> float:
    """The share of requests at risk from which one more instance (beyond `instances`) pays."""
    return cfg.instance_price / (cfg.base_price + instances * cfg.instance_price)


def target(cfg: PoolScaleConfig, x: PoolScaleInputs) -> int:
    if x.requests <= 0:
        return cfg.min_instances
    share = x.at_risk / x.requests
    first = pays_share(cfg, 0)
    if share >= first:
        t = max(x.instances, 1)
        if x.instances >= 1 and x.occupancy > cfg.busy_share and share >= pays_share(cfg, x.instances):
            t = x.instances + 1
    elif share < first / 2:
        t = 0
    else:
        t = x.instances
    return min(max(t, cfg.min_instances), cfg.max_instances)
