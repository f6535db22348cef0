"""Pipeline choice per request (docs/design.md, issue 6 item 4).

Only two pipelines exist: P->MD (the missed KV crosses the WAN fast enough) and P->RLD->MD
(RLD hides a long WAN transfer by decoding the first tokens next to P, then hands over to MD).
P->RLD alone is never chosen, except for *odd traffic*: a short output (< threshold tokens)
whose WAN transfer would outlast its whole decode on RLD; RLD finishes it and the WAN transfer
is cancelled; and while no MD is in service (a WAN cut takes every MD of a site out) but a P and an
RLD are: RLD serves the request alone, none goes to an MD that is out only to reach RLD through a
migration after its idle deadline (`in_service`, which the router's placement reads from its peers'
health; the simulator's roles are always in service). `allow_relay_only` exists only to reproduce
the relay-only oscillation (docs/sim.md, Oscillation).

WAN time is predicted as (bytes queued ahead on the chosen P's lane to MD's site + missed bytes) /
estimated bandwidth + RTT, where missed bytes are the prompt tokens beyond MD's radix-cache hit times
the KV bytes per token (`policy.site_links`, `policy.wan_queue`). With a TTFT SLA (`ttft_slo_s`, the
router's `--ttft-slo-secs`) the decision is the relay placement (`policy.relay_placement`, the
simulator's own): a relay instance with a free slot (`relay_pool`: the router's RLDs in service and
their load) takes a request whose WAN time is over twice the RTT; else the never-lose rules
(`policy.never_lose`): P->MD within half the SLA, else a relay on the chosen P only while it has no
queue (`prefill_state`, which the router's placement reads from P's gauges) and only where P can relay
(`p_relays`: the router's chosen P is a prefill that relays, `--pdd-relay local`), else P->MD. By default (no router) P relays and the pool is
down: the never-lose rules alone.
"""

from __future__ import annotations

import enum
import math
import logging
from dataclasses import dataclass
from typing import Callable

from sglang_pdd.policy import never_lose, relay_placement
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.pipelines import Pipeline
from sglang_pdd.policy.site_links import SiteLinks

logger = logging.getLogger(__name__)


# The reason of a request sent P->RLD because no MD is in service (a metric label reads its start).
NO_MAIN = "no main server in service: the relay serves it alone"


@dataclass(frozen=True)
class InService:
    """Which roles have a server in service now (the router: its peers' health)."""

    prefill: bool = True
    relay: bool = True
    main: bool = True

    @property
    def relay_alone(self) -> bool:
        """Every MD is out and a P and an RLD are in service: RLD alone can serve a request."""
        return self.prefill and self.relay and not self.main


class RouteBy(str, enum.Enum):
    BANDWIDTH = "bandwidth"  # predicted WAN time against a budget (ours)
    HIT_THRESHOLD = "hit-threshold"  # MD hit rate against a fixed threshold


@dataclass(frozen=True)
class PrefillState:
    """The P chosen for the request, as the router sees it (its URL, its waiting queue)."""

    url: str
    waiting: float = 0.0  # requests waiting for a prefill forward on it (its `sglang:num_queue_reqs`)
    busy_fraction: float = 0.0  # its recent busy share of time (`policy.busy_fraction`; the headroom rule)


@dataclass(frozen=True)
class RouteInputs:
    input_len: int  # prompt tokens
    md_prefix_hit: int  # prompt tokens MD's decode radix cache already holds
    max_output_tokens: int
    rld_kv_usage: float = 0.0  # RLD pool load, 0..1 (only the relay-only experiment reads it)
    site: str = ""  # the chosen MD's site: its WAN link (`site_links`)

    @property
    def md_hit_rate(self) -> float:
        return self.md_prefix_hit / self.input_len if self.input_len else 1.0


@dataclass(frozen=True)
class RouteDecision:
    pipeline: Pipeline
    reason: str
    missed_bytes: int
    predicted_wan_s: float
    placement: str = ""  # with a TTFT SLA: where the relay runs (`relay_placement.Placement`), else ""
    rule: str = ""  # with a TTFT SLA: the rule that decided (`relay_placement.RULES`), else ""
    at_risk: bool = False  # with a TTFT SLA: predicted over it because of the line (the pool's scale signal)

    @property
    def uses_relay(self) -> bool:
        return self.pipeline is not Pipeline.P_MD

    @property
    def uses_wan(self) -> bool:
        return self.pipeline is not Pipeline.P_RLD


@dataclass(frozen=True)
class PipelinePolicyConfig:
    kv_bytes_per_token: int
    wan_budget_s: float = 1.0  # P->MD when the predicted WAN time is at most this
    route_by: RouteBy = RouteBy.BANDWIDTH
    hit_threshold: float = 0.95  # for RouteBy.HIT_THRESHOLD
    odd_output_threshold: int = 500  # the paper's 500-token threshold for odd traffic (docs/sim.md §2, "Request lifecycle")
    rld_tpot_s: float = 0.05  # expected RLD time per output token, to test "decode < WAN"
    allow_relay_only: bool = False  # reproduce the relay-only oscillation (docs/sim.md): low hit -> P->RLD
    relay_only_below_hit: float = 0.9
    relay_only_max_rld_usage: float = math.inf  # an overload guard: relay-only stops above this
    ttft_slo_s: float = 0.0  # > 0: the never-lose decision, budget half of it (0: wan_budget_s, no slack rule)

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0 or self.wan_budget_s < 0 or self.rld_tpot_s <= 0 or self.ttft_slo_s < 0:
            raise ValueError(f"invalid pipeline policy config {self}")


class PipelinePolicy:
    """`bandwidth`, `rtt_s`: the default link; `links` adds one per site (`policy.site_links`).
    `in_service`: which roles have a server in service now (every role by default; the router's
    `Placement` sets it from its peer pools)."""

    def __init__(self, cfg: PipelinePolicyConfig, bandwidth: BandwidthEstimator, rtt_s: float,
                 links: SiteLinks | None = None):
        self.cfg, self.bandwidth, self.rtt_s = cfg, bandwidth, rtt_s
        self.in_service: Callable[[], InService] = InService
        self.prefill_state: Callable[[], PrefillState | None] = lambda: None  # the placement's chosen P
        self.relay_pool: Callable[[], relay_placement.PoolView] = relay_placement.PoolView  # relay instances
        self.p_relays = True  # the chosen P can host a relay (the router's `Placement` says which P can)
        self.links = links if links is not None else SiteLinks.single(bandwidth, rtt_s)
        # the relay placement's rules (with a TTFT SLA); relay_slowdown 1: a relay on P is not priced yet (its
        # decode steps ride between P's prefill steps; their measured cost is issue 45's item 5)
        self._placement_cfg = relay_placement.PlacementConfig(
            never_lose.NeverLoseConfig(wan_budget_s=cfg.ttft_slo_s / 2, p_slack_s=0.0,
                                       odd_output_threshold=cfg.odd_output_threshold, warm_md=False),
            cfg.ttft_slo_s) if cfg.ttft_slo_s > 0 else None
        if self.links.default.bandwidth is not bandwidth:
            raise ValueError("links.default must be the policy's own bandwidth estimator")

    def missed_bytes(self, inp: RouteInputs) -> int:
        hit = min(max(inp.md_prefix_hit, 0), inp.input_len)
        return (inp.input_len - hit) * self.cfg.kv_bytes_per_token

    def predict_wan_s(self, missed_bytes: int, site: str = "", prefill: str = "") -> float:
        return self.links.of(site).predict_s(missed_bytes, prefill)

    def decide(self, inp: RouteInputs) -> RouteDecision:
        cfg = self.cfg
        missed = self.missed_bytes(inp)
        pf = self.prefill_state()
        wan = self.predict_wan_s(missed, inp.site, pf.url if pf is not None else "")

        def out(p: Pipeline, why: str, **placed) -> RouteDecision:
            if p is not Pipeline.P_RLD and pf is not None:  # MD's leg: on P's lane until P's next page says so
                self.links.of(inp.site).routed_to(pf.url, missed)
            return RouteDecision(p, why, missed, wan, **placed)

        if self.in_service().relay_alone:
            return out(Pipeline.P_RLD, NO_MAIN)
        if cfg.ttft_slo_s > 0 and cfg.route_by is RouteBy.BANDWIDTH and not cfg.allow_relay_only:
            d = self._placement(inp, missed, pf)
            return out(d.pipeline, d.reason, placement=d.placement.value, rule=d.rule, at_risk=d.at_risk)
        if cfg.route_by is RouteBy.HIT_THRESHOLD:
            fits = inp.md_hit_rate >= cfg.hit_threshold
            fit_why = f"MD hit {inp.md_hit_rate:.3f} >= {cfg.hit_threshold}"
        else:
            fits = wan <= cfg.wan_budget_s
            fit_why = f"predicted WAN {wan:.3f}s <= budget {cfg.wan_budget_s}s"
        if fits:
            return out(Pipeline.P_MD, fit_why)
        decode_s = inp.max_output_tokens * cfg.rld_tpot_s
        if inp.max_output_tokens < cfg.odd_output_threshold and decode_s < wan:
            return out(Pipeline.P_RLD, f"odd traffic: output {inp.max_output_tokens} < "
                       f"{cfg.odd_output_threshold} and RLD decode {decode_s:.2f}s < WAN {wan:.2f}s")
        if (cfg.allow_relay_only and inp.md_hit_rate < cfg.relay_only_below_hit
                and inp.rld_kv_usage < cfg.relay_only_max_rld_usage):
            return out(Pipeline.P_RLD, f"relay-only allowed: MD hit {inp.md_hit_rate:.3f} < "
                       f"{cfg.relay_only_below_hit}")
        return out(Pipeline.P_RLD_MD, f"WAN {wan:.3f}s too slow for P->MD: RLD hides it")

    def _placement(self, inp: RouteInputs, missed: int, pf: PrefillState | None):
        link = self.links.of(inp.site)
        rate = link.bandwidth.bytes_per_s
        busy = pf is not None and pf.waiting > 0  # the router sees whether P has a queue, not its length in s
        p_wait = math.inf if busy else 0.0
        obs = never_lose.Observation(missed, inp.max_output_tokens, [link.queued_bytes(pf.url if pf else "")], rate,
                                     rate, link.rtt_s, p_wait, self.cfg.rld_tpot_s, fifo=True,
                                     p_busy_fraction=pf.busy_fraction if pf is not None else 0.0)
        # P's part of the TTFT: 0 when idle; with a queue of unknown length the line is not blamed (not at risk)
        return relay_placement.decide(self._placement_cfg, obs, p_wait, self.relay_pool(), self.p_relays)
