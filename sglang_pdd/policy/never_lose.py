"""The never-lose relay decision (docs/sim.md §9): relay only where relaying pays.

One pure function shared by the simulator (`lab/sim/never_lose.py`) and the router's pipeline
policy (`policy.pipeline`, with `--ttft-slo-secs`). Each rule reads only what a deployment
observes, and each can be switched off (for the tests and the ablation):

1. `queue_aware`: the WAN time of MD's miss is predicted on P's lane as it is now (the bytes
   already queued towards MD's site, the line's measured drain rate; `policy.wan_queue`), not as
   if the line were idle. `load_aware` adds the transfers that will start meanwhile: on a line
   busy a share `u` of the recent time, a fairly shared transfer of `b` bytes takes `b / rate /
   (1 - u)` on average (M/G/1 processor sharing); the prediction is the larger of the two.
2. The request goes P->MD when that time is within `wan_budget_s` (the router and
   `--scenario never-lose` set half the TTFT SLA: relay only what the line would make a near miss).
3. `slack_admission`: a relay is admitted only when the prefilling P has slack: its queue drains
   within `p_slack_s` (by default 0: only an idle P relays). Otherwise the request goes P->MD: a
   busy P slowed by relaying costs every request queued on it, the relay saves one.
   `headroom_admission`: nor when relaying would cost P's other requests more waiting than it saves
   the relayed one. A P that hosts the relay prefills `relay_slowdown` times slower while the relay
   decodes (1 for a dedicated RLD). An idle P at the moment of arrival can still be busy most of
   the time (`p_busy_fraction`, `policy.busy_fraction`); over the T seconds the relay runs, its load
   goes from rho to rho x slowdown, and each of the rho x T / S requests that arrive meanwhile (S: a
   prefill's service time) waits S x (W(rho x slowdown) - W(rho)) longer, W(x) = x / (1 - x) (an
   M/M/1 queue's mean wait in service times). The relay saves its own request about T. So it is
   admitted when rho x (W(rho x slowdown) - W(rho)) <= 1: no setting of its own, and T and S cancel.
4. Odd traffic (output < `odd_output_threshold`, decode shorter than the WAN time) finishes on
   the relay (P->RLD); everything else relayed is P->RLD->MD.
5. `warm_md`: an odd (P->RLD) request still sends its prompt's missed KV to MD in the background
   when the line has room: the bytes already queued drain within `wan_budget_s`. MD's radix
   cache then stays warm for the session's next turns (the simulator's; the router does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sglang_pdd.policy.pipelines import Pipeline
from sglang_pdd.policy.wan_queue import finish_s


@dataclass(frozen=True)
class NeverLoseConfig:
    wan_budget_s: float = 1.0  # P->MD when the predicted WAN time is at most this (half the TTFT SLA)
    p_slack_s: float = 0.0  # a P with more queued prefill (s) than this does not relay (0: idle P only)
    odd_output_threshold: int = 500  # the paper's odd-traffic threshold
    queue_aware: bool = True
    load_aware: bool = False
    slack_admission: bool = True
    headroom_admission: bool = True
    warm_md: bool = True
    relay_slowdown: float = 1.0  # P's prefill time factor while its relay side decodes (1: dedicated RLD)

    def __post_init__(self) -> None:
        if (self.wan_budget_s < 0 or self.p_slack_s < 0 or self.odd_output_threshold < 0
                or not self.relay_slowdown >= 1.0):
            raise ValueError(f"invalid never-lose config {self}")


@dataclass(frozen=True)
class Observation:
    missed_bytes: float  # prompt KV past MD's radix hit
    output_tokens: int
    lane_queued: Sequence[float]  # bytes queued ahead on P's lane to MD's site (per transfer, or one total)
    line_bytes_per_s: float  # the line's measured drain rate
    flow_bytes_per_s: float  # the per-transfer estimate (`policy.bandwidth`), idle-line view
    rtt_s: float
    p_wait_s: float  # the prefilling P's queue, in seconds of its prefill rate (inf: busy, length unknown)
    rld_tpot_s: float  # expected relay time per output token
    fifo: bool = False  # the lane writes in order (the serving P) rather than sharing the line fairly
    p_busy_fraction: float = 0.0  # the prefilling P's recent busy share of time (`policy.busy_fraction`)
    line_busy_fraction: float = 0.0  # the line's recent busy share of time (P's lane to MD's site)


# Which rule decided (a metric label: a small fixed set, unlike `reason`, which carries the figures).
WITHIN_BUDGET, P_QUEUE, P_HEADROOM = "wan-within-budget", "p-queue", "p-headroom"  # P->MD
ODD_TRAFFIC, HIDES_WAN = "odd-traffic", "relay-hides-wan"  # relayed


@dataclass(frozen=True)
class Decision:
    pipeline: Pipeline
    reason: str
    predicted_wan_s: float
    warm_md: bool = False  # P->RLD only: send the prompt's KV to MD in the background
    rule: str = ""  # one of the rule names above


MAX_LOAD = 0.99  # a line busy all the time predicts 100x its idle time, not infinity


def predict_wan_s(cfg: NeverLoseConfig, obs: Observation) -> float:
    if not cfg.queue_aware:
        return obs.missed_bytes / obs.flow_bytes_per_s + obs.rtt_s
    now = finish_s(obs.missed_bytes, obs.lane_queued, obs.line_bytes_per_s, obs.rtt_s, obs.fifo)
    if not cfg.load_aware:
        return now
    u = min(max(obs.line_busy_fraction, 0.0), MAX_LOAD)
    return max(now, obs.missed_bytes / obs.line_bytes_per_s / (1.0 - u) + obs.rtt_s)


def line_has_room(cfg: NeverLoseConfig, obs: Observation) -> bool:
    return sum(obs.lane_queued) <= obs.line_bytes_per_s * cfg.wan_budget_s


def relay_wait_cost(busy: float, slowdown: float) -> float:
    """Waiting the relay adds to P's other requests per second of waiting it saves its own
    (`headroom_admission`): rho x (W(rho x slowdown) - W(rho)), W(x) = x / (1 - x); inf when the slowed
    P could not keep up at all."""
    if slowdown <= 1.0:
        return 0.0  # a relay that does not slow P (a dedicated RLD) adds no wait, even to a saturated P
    rho = min(max(busy, 0.0), 1.0)
    slowed = rho * slowdown
    if slowed >= 1.0:
        return math.inf
    return rho * (slowed / (1.0 - slowed) - rho / (1.0 - rho))


def decide(cfg: NeverLoseConfig, obs: Observation) -> Decision:
    wan = predict_wan_s(cfg, obs)
    if wan <= cfg.wan_budget_s:
        return Decision(Pipeline.P_MD, f"predicted WAN {wan:.3f}s <= budget {cfg.wan_budget_s}s", wan,
                        rule=WITHIN_BUDGET)
    if cfg.slack_admission and obs.p_wait_s > cfg.p_slack_s:
        return Decision(Pipeline.P_MD, f"no relay: P's queue {obs.p_wait_s:.2f}s > slack "
                        f"{cfg.p_slack_s}s (WAN {wan:.2f}s)", wan, rule=P_QUEUE)
    cost = relay_wait_cost(obs.p_busy_fraction, cfg.relay_slowdown) if cfg.headroom_admission else 0.0
    if cost > 1.0:
        return Decision(Pipeline.P_MD, f"no relay: P busy {obs.p_busy_fraction:.0%}, x {cfg.relay_slowdown:.3g} "
                        f"while relaying: the others would wait {cost:.3g}x what it saves (WAN {wan:.2f}s)", wan,
                        rule=P_HEADROOM)
    decode_s = obs.output_tokens * obs.rld_tpot_s
    if obs.output_tokens < cfg.odd_output_threshold and decode_s < wan:
        warm = cfg.warm_md and line_has_room(cfg, obs)
        return Decision(Pipeline.P_RLD, f"odd traffic: output {obs.output_tokens}, relay decode "
                        f"{decode_s:.2f}s < WAN {wan:.2f}s" + ("; MD warmed" if warm else ""),
                        wan, warm, ODD_TRAFFIC)
    return Decision(Pipeline.P_RLD_MD, f"WAN {wan:.3f}s > budget {cfg.wan_budget_s}s: relay hides it", wan,
                    rule=HIDES_WAN)
