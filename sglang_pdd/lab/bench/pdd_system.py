"""The PDD pipeline as bench systems: P and RLD in cluster A, MD in cluster B, the PDD router in A.

* `pdd`: the PDD router with `--pipeline auto` (its pipeline policy picks P->MD when MD's missed
  KV is predicted to cross the WAN within `--wan-budget-s`, else P->RLD->MD, or P->RLD for odd
  traffic); told the testbed's link (`--wan-mbit`, `--wan-rtt-ms`), the model's KV size and the
  preset's TTFT SLA (`--ttft-slo-secs`: the relay placement, `policy.relay_placement`, with RLD as the
  relay pool of one instance, its slots RLD's --max-running-requests).
* `pdd-relay`: the same servers, `--pipeline relay`: every request P->RLD->MD.

P runs `--pdd-role prefill`, RLD `--pdd-role relay --pdd-token-port`, MD `--pdd-role main` with the
decode radix cache and its KV events published over ZMQ (`--kv-events-config`), which the router
subscribes to across the WAN (`--main-kv-events`) for an exact view of MD's cache; every server and the router get the same `SGLANG_PDD_SECRET` (fresh per start). The client
streams from the router exactly as for the baselines.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import ClassVar

from sglang_pdd.lab.bench.systems import (BOOTSTRAP_PORT, DECODE_PORT, PREFILL_PORT, ROUTER_PORT, Deployment,
                                      UpstreamPD, register)
from sglang_pdd.lab.testing.launch_args import PddRouterConfig, ServerConfig
from sglang_pdd.lab.testing.servers import ServerGroup

logger = logging.getLogger(__name__)

RELAY_PORT, TOKEN_PORT = 30250, 18500
EVENTS_PORT, REPLAY_PORT = 5557, 5558  # MD's KV events (the router's exact view of MD's cache)
WAN_EFFICIENCY = 0.946  # TCP goodput / configured rate on the testbed (docs/testbed.md)


def router_link_args(testbed, kv_bytes_per_token: int | None, odd_threshold: int = 0,
                     ttft_slo_s: float = 0.0) -> list[str]:
    """What the PDD router is told about the link: the testbed's configured rate and RTT; and the
    preset's TTFT SLA (`ttft_slo_s` > 0: the never-lose decision reads it).

    The odd-traffic filter is off unless a system sets `odd_threshold`: the presets' outputs are
    tens of tokens (the paper's are 1K), so with the paper's 500-token threshold every request would
    count as odd and never reach MD."""
    cfg = getattr(testbed, "config", None)
    rate = getattr(cfg, "rate_mbit", None)
    delay = getattr(cfg, "delay_ms", None)
    args = ["--odd-output-threshold", str(odd_threshold)]
    if rate:
        args += ["--wan-mbit", f"{rate * WAN_EFFICIENCY:g}"]
    if delay is not None:
        args += ["--wan-rtt-ms", f"{2 * delay:g}"]
    if kv_bytes_per_token:
        args += ["--kv-bytes-per-token", str(kv_bytes_per_token)]
    if ttft_slo_s > 0:
        args += ["--ttft-slo-secs", f"{ttft_slo_s:g}"]
    return args


class PddRouted(UpstreamPD):
    pipeline: ClassVar[str] = "auto"
    handoff_mode: ClassVar[str] = "adaptive"  # MD's --pdd-handoff-mode
    odd_threshold: ClassVar[int] = 0  # the router's --odd-output-threshold (0: off)
    router_extra: ClassVar[tuple[str, ...]] = ()
    # adaptive handoff on RLD: one-shot while MD runs at most this many requests. The default (8)
    # never sees a bigger MD batch at this testbed's concurrency; 2 lets the policy choose.
    adaptive_md_batch: ClassVar[int] = 2
    packed_wan: ClassVar[str] = "off"  # --pdd-packed-wan of P and MD
    mains: ClassVar[int] = 1  # MD servers in cluster B (ports DECODE_PORT + 10 i, events + 10 i)
    peer_policy: ClassVar[str] = "cache-aware"  # the router's --peer-policy

    def start(self, dep: Deployment) -> None:
        tb = self._tb = dep.testbed
        a_ns, b_ns = tb.ns("A"), tb.ns("B")
        a, b = tb.addr("A"), tb.addr("B")
        env = {"SGLANG_PDD_SECRET": secrets.token_hex(16)}
        common = dict(model=dep.model, bootstrap_port=BOOTSTRAP_PORT, env=env)
        g = self._group = ServerGroup(dep.log_dir, grace_s=0)  # killed between systems
        p = self._prefill = g.start("prefill", dep.server(ServerConfig(
            port=PREFILL_PORT, host=a, nccl_port=PREFILL_PORT + 1000, mode="prefill",
            extra=["--pdd-role", "prefill", "--pdd-packed-wan", self.packed_wan], **common), "A"))
        rld_config = ServerConfig(
            port=RELAY_PORT, host=a, nccl_port=RELAY_PORT + 1000, mode="decode",
            extra=["--pdd-role", "relay", "--pdd-token-port", str(TOKEN_PORT),
                   "--pdd-adaptive-md-batch", str(self.adaptive_md_batch),
                   # on cluster A's testbed address: the token channel in clear must be asked for (the WAN is a
                   # veth pair inside this box; a deployment encrypts it with --pdd-token-curve)
                   "--pdd-token-curve", "off"], **common)
        rld = g.start("relay", dep.server(rld_config, "A"))
        mds = [g.start("main" if i == 0 else f"main-{i}", dep.server(ServerConfig(
            port=DECODE_PORT + 10 * i, host=b, nccl_port=DECODE_PORT + 1000 + 10 * i, mode="decode",
            decode_radix_cache=True,
            extra=["--pdd-role", "main", "--pdd-relays", f"tcp://{a}:{TOKEN_PORT}", "--pdd-handoff-mode", self.handoff_mode,
                   "--pdd-packed-wan", self.packed_wan, "--kv-events-config",
                   json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{EVENTS_PORT + 10 * i}",
                               "replay_endpoint": f"tcp://*:{REPLAY_PORT + 10 * i}"})], **common), "B"))
               for i in range(self.mains)]
        a_ns.call(p.wait_ready)
        a_ns.call(rld.wait_ready)
        for md in mds:
            b_ns.call(md.wait_ready)
        events = []
        for i in range(self.mains):
            events += ["--main-kv-events", f"tcp://{b}:{EVENTS_PORT + 10 * i}", f"tcp://{b}:{REPLAY_PORT + 10 * i}"]
        self._router = g.start("router", dep.process(PddRouterConfig(
            prefill=[(p.url, BOOTSTRAP_PORT)], relay=[(rld.url, TOKEN_PORT)], main=[md.url for md in mds],
            tokenizer=dep.model, port=ROUTER_PORT, host=a, pipeline=self.pipeline,
            extra=router_link_args(tb, dep.kv_bytes_per_token, self.odd_threshold, self._slo(dep))
            + list(self.router_extra)
            + ["--peer-policy", self.peer_policy, "--relay-slots", str(rld_config.max_running_requests)] + events,
            env=env), "A"))
        a_ns.call(self._router.wait_ready)
        logger.info("%s up: P %s, RLD %s (token channel :%d), MD %s, router %s (pipeline %s, %s)", self.name,
                    p.url, rld.url, TOKEN_PORT, ", ".join(md.url for md in mds), self._router.url, self.pipeline,
                    self.peer_policy)

    def _slo(self, dep: Deployment) -> float:
        """The SLA the router's policy reads: only where the policy decides, and not for the relay-only
        experiment (the router refuses the two together)."""
        return dep.ttft_slo_s if self.pipeline == "auto" and "--allow-relay-only" not in self.router_extra else 0.0

    def send_warmup(self, body: dict, timeout_s: float):
        """A warm-up stands for the history that earlier turns left on MD (long outputs): it goes
        P->MD. Routed by the policy, its one output token would make it odd traffic (or relay-only),
        and MD would start every session cold."""
        return self.send({**body, "pdd_pipeline": "direct"}, timeout_s)


@register("pdd")
class Pdd(PddRouted):
    name = "pdd"
    sim_name = "pdd-bw"
    description = "PDD: P+RLD in A, MD (radix cache) in B, PDD router (pipeline auto) in A"
    pipeline = "auto"


@register("pdd-packed")
class PddPacked(Pdd):
    name = "pdd-packed"
    description = "pdd with the packed WAN path (--pdd-packed-wan plain on P and MD)"
    packed_wan = "plain"


@register("pdd-direct")
class PddDirect(PddRouted):
    name = "pdd-direct"
    sim_name = "xdc-pd-drc"
    description = "every request P->MD through the PDD router, page-by-page WAN writes (pdd-direct-packed's baseline)"
    pipeline = "direct"


@register("pdd-direct-packed")
class PddDirectPacked(PddRouted):
    name = "pdd-direct-packed"
    sim_name = "xdc-pd-drc"
    description = "every request P->MD through the PDD router, packed WAN path (isolates packing from relaying)"
    pipeline = "direct"
    packed_wan = "plain"


@register("pdd-relay")
class PddRelay(PddRouted):
    name = "pdd-relay"
    sim_name = "pdd-adaptive"
    description = "PDD, every request P->RLD->MD (PDD router, pipeline relay), adaptive handoffs"
    pipeline = "relay"


@register("pdd-relay-oneshot")
class PddRelayOneShot(PddRelay):
    name = "pdd-relay-oneshot"
    sim_name = "pdd-one-shot"
    description = "PDD, every request P->RLD->MD, one-shot handoffs only"
    handoff_mode = "one-shot"


@register("pdd-relay-catchup")
class PddRelayCatchUp(PddRelay):
    name = "pdd-relay-catchup"
    sim_name = "pdd-catch-up"
    description = "PDD, every request P->RLD->MD, catch-up handoffs only"
    handoff_mode = "catch-up"


@register("pdd-odd")
class PddOdd(Pdd):
    name = "pdd-odd"
    sim_name = "pdd-bw"
    description = "PDD with the odd-traffic filter on (outputs under 33 tokens whose WAN time exceeds their decode)"
    odd_threshold = 33


@register("pdd-relay-only")
class PddRelayOnly(Pdd):
    name = "pdd-relay-only"
    sim_name = "pdd-relay-only"
    description = "the excluded relay-only policy (docs/sim.md, Oscillation): requests with MD hit < 0.9 finish on RLD alone (P->RLD)"
    router_extra = ("--allow-relay-only", "--relay-only-below-hit", "0.9")


@register("pdd-2md-cache-aware")
class PddTwoMdCacheAware(PddRouted):
    name = "pdd-2md-cache-aware"
    sim_name = "xdc-pd-drc"
    description = "two MDs in cluster B, every request P->MD, the router's cache-aware MD choice"
    pipeline = "direct"
    mains = 2


@register("pdd-2md-least-loaded")
class PddTwoMdLeastLoaded(PddTwoMdCacheAware):
    name = "pdd-2md-least-loaded"
    description = "two MDs in cluster B, every request P->MD, least-loaded MD choice (the cache-blind baseline)"
    peer_policy = "least-loaded"
