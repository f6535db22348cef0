"""Where a request's relay runs, if anywhere: P's spare capacity, the elastic relay pool, or nowhere.

One pure function (issue 46 item 1), run by the simulator (`lab/sim/never_lose.py`) and meant for
the router, over what a deployment observes. Two kinds of relay capacity:

1. **P's spare capacity** (the relay on P, decoding in P's own batches): no bill, only the waiting its
   decode steps add to P's other requests. It is taken exactly as `policy.never_lose` takes it: a
   request whose predicted WAN time exceeds the WAN budget (half the TTFT SLA: relay only what the
   line would turn into a near miss), on an idle P whose headroom rule admits it. It is the only relay
   capacity while the pool is down, i.e. wherever relaying has not been worth an instance's bill.
2. **The elastic relay pool** (instances of their own, billed while up): an instance that is up is
   already paid for, so a free slot on it costs nothing more, less than P's relay, which slows P's
   other requests (and, on the shared trace, moves P's queues and so the cache-aware choice of P). While
   it has a free slot it takes any request whose predicted WAN time is over `pool_budget_s` (by
   default twice the line's RTT: what the relay's handoff to MD adds back in round trips): the first
   token then comes from the relay right after prefill, and an odd request's bytes never load the
   line. An odd request the pool finishes warms MD (its prompt's KV sent in the background) only when
   the lane drains within that budget, i.e. is nearly idle: on a fairly shared line a background
   transfer slows the transfers that carry other requests' first tokens, and the pool is up because
   the line is loaded. Whether the pool is up at all is the scale signal's question
   (`policy.relay_pool_scale`), which weighs the requests at risk against the pool's bill.
3. Otherwise nothing is relayed: the request goes P->MD, as xdc-pd-drc sends it. So does a request
   P would have relayed when P cannot relay (`p_relays` False: a router's P without `--pdd-relay local`)
   and the pool has no free slot (rule `no-relay-capacity`).

Each decision names the rule that made it (`rule`, one of `RULES`: a metric label) beside its
`reason` (the figures, for a log line).

"At risk": the request's predicted P->MD TTFT (P's queue, its own prefill, and the queue-aware WAN
time) exceeds the TTFT SLA, and the line's part of it is at least P's: the line, not P, would make it
miss, and a relay takes the line's part out of its TTFT. A request that P's queue makes late is not
at risk: no relay saves it. (The load-aware WAN time, `load_aware`, counted 25-27 % of the paper
workload's requests at risk for a minute at 22.6 req/s on the 40 G line, where xdc-pd-drc misses
13-15 % and meets the SLA over the run: the pool came up and lost 5.7 % BCR. The queue-aware one
counts at most 6 % there, and 20-50 % on the shared trace where xdc-pd-drc fails.)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from sglang_pdd.policy import never_lose
from sglang_pdd.policy.pipelines import Pipeline


class Placement(str, enum.Enum):
    NONE = "none"  # P->MD: nothing relayed
    ON_P = "p"  # the relay on the prefilling P (P's spare capacity)
    POOL = "pool"  # an elastic relay pool instance


NO_RELAY_CAPACITY = "no-relay-capacity"  # P would relay, but P cannot and the pool has no free slot
RULES = (never_lose.WITHIN_BUDGET, never_lose.P_QUEUE, never_lose.P_HEADROOM, NO_RELAY_CAPACITY,
         never_lose.ODD_TRAFFIC, never_lose.HIDES_WAN)


@dataclass(frozen=True)
class PlacementConfig:
    rules: never_lose.NeverLoseConfig  # P's admission; `wan_budget_s` is half the TTFT SLA
    ttft_slo_s: float = 5.0  # the operator's TTFT SLA: a request predicted over it is at risk
    pool_budget_s: Optional[float] = None  # a pool instance that is up relays a WAN time over this
    # (None: twice the line's RTT)

    def __post_init__(self) -> None:
        if (self.pool_budget_s is not None and self.pool_budget_s < 0) or not self.ttft_slo_s > 0:
            raise ValueError(f"invalid placement config {self}")

    @classmethod
    def for_slo(cls, ttft_slo_s: float, **rules) -> "PlacementConfig":
        """The default for a TTFT SLA: P's WAN budget half of it."""
        return cls(never_lose.NeverLoseConfig(wan_budget_s=ttft_slo_s / 2, **rules), ttft_slo_s)

    def pool_budget(self, rtt_s: float) -> float:
        return 2 * rtt_s if self.pool_budget_s is None else self.pool_budget_s


@dataclass(frozen=True)
class PoolView:
    up: int = 0  # instances serving (not starting, not draining)
    free_slots: int = 0  # relayed requests they can still take now (batch slots with KV room)


@dataclass(frozen=True)
class PlacementDecision:
    placement: Placement
    pipeline: Pipeline
    reason: str
    predicted_wan_s: float  # queue-aware, as the line is now
    predicted_ttft_s: float  # P->MD: P's queue + own prefill + that WAN time
    at_risk: bool  # over the TTFT SLA, the line's part at least P's: a relay could save its SLA
    warm_md: bool = False  # P->RLD only: send the prompt's KV to MD in the background
    rule: str = ""  # which rule decided (one of RULES)


def decide(cfg: PlacementConfig, obs: never_lose.Observation, p_ttft_s: float,
           pool: PoolView = PoolView(), p_relays: bool = True) -> PlacementDecision:
    """`p_ttft_s`: P's queue plus this request's own prefill time, in seconds of P's prefill rate.
    `p_relays`: the prefilling P can host a relay (the relay on P)."""
    rules = cfg.rules
    on_p = never_lose.decide(rules, obs)
    wan = on_p.predicted_wan_s
    ttft = p_ttft_s + wan
    risk = ttft > cfg.ttft_slo_s and wan >= p_ttft_s
    budget = cfg.pool_budget(obs.rtt_s)
    if pool.free_slots > 0 and wan > budget:
        decode_s = obs.output_tokens * obs.rld_tpot_s
        if obs.output_tokens < rules.odd_output_threshold and decode_s < wan:
            warm = rules.warm_md and sum(obs.lane_queued) <= obs.line_bytes_per_s * budget
            return PlacementDecision(Placement.POOL, Pipeline.P_RLD,
                                     f"pool, odd traffic: relay decode {decode_s:.2f}s < WAN {wan:.2f}s"
                                     + ("; MD warmed" if warm else ""), wan, ttft, risk, warm,
                                     never_lose.ODD_TRAFFIC)
        return PlacementDecision(Placement.POOL, Pipeline.P_RLD_MD,
                                 f"pool: WAN {wan:.3f}s > {budget:.3f}s, the relay hides it", wan, ttft, risk,
                                 rule=never_lose.HIDES_WAN)
    why = "" if wan <= budget else "; pool down" if pool.up == 0 else "; pool full"
    if on_p.pipeline is not Pipeline.P_MD:
        if p_relays:
            return PlacementDecision(Placement.ON_P, on_p.pipeline, "on P: " + on_p.reason, wan, ttft, risk,
                                     on_p.warm_md, on_p.rule)
        return PlacementDecision(Placement.NONE, Pipeline.P_MD, f"no relay capacity: {on_p.reason}; P does not "
                                 f"relay{why}", wan, ttft, risk, rule=NO_RELAY_CAPACITY)
    return PlacementDecision(Placement.NONE, Pipeline.P_MD, on_p.reason + why, wan, ttft, risk, rule=on_p.rule)
