"""The router's Prometheus series (its /metrics page): requests, tokens, handoffs, MD choices, peers'
load, migrations, time to first token, and the front door (open connections, requests in flight, the
configured limits and every refusal by reason)."""

from __future__ import annotations

from sglang_pdd.policy.pipeline import NO_MAIN
from sglang_pdd.policy.relay_placement import RULES, Placement
from sglang_pdd.router.request.dispatch import Outcome

# Why the front door refused a connection or a request (sglang_pdd_router_refused_total{reason}).
REFUSALS = ("connections", "in-flight", "per-client", "tokenizer-queue", "header-timeout", "body-timeout", "auth",
            "body-budget", "grammar-queue")
# The limits exported as sglang_pdd_router_limit{limit}.
LIMITS = ("connections", "in-flight", "per-client", "tokenizer-queue", "body-bytes", "grammar-queue")

# TTFT buckets (seconds): a same-site first token is tens of ms, a cold prompt whose KV crosses a slow WAN
# can take seconds to tens of seconds.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _relay_alone_kind(reason: str) -> str:
    """Why a request went P->RLD alone (the label of sglang_pdd_router_wan_bytes_avoided)."""
    if reason.startswith("odd"):
        return "odd-traffic"
    return "no-main" if reason.startswith(NO_MAIN) else "relay-only"


class RouterMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter  # a declared dependency

        self.registry = CollectorRegistry()
        self.requests = Counter("sglang_pdd_router_requests", "Requests by pipeline and outcome",
                                ("pipeline", "outcome"), registry=self.registry)
        self.tokens = Counter("sglang_pdd_router_output_tokens", "Output tokens by source",
                              ("source",), registry=self.registry)
        self.handoffs = Counter("sglang_pdd_router_handoffs", "Relay-to-main handoffs by mode",
                                ("mode",), registry=self.registry)
        self.relayed = Counter("sglang_pdd_router_relayed", "Relayed requests by who relayed them: an RLD "
                               "(relay) or the prefill itself (prefill, --pdd-relay local)", ("target",),
                               registry=self.registry)
        from prometheus_client import Gauge, Histogram

        self.bandwidth = Gauge("sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second",
                               "The pipeline policy's WAN bandwidth estimate", registry=self.registry)
        self.avoided = Counter("sglang_pdd_router_wan_bytes_avoided",
                               "MD's predicted missed KV bytes never sent over the WAN (served P->RLD: "
                               "odd traffic, relay-only, or no MD in service)", ("reason",), registry=self.registry)
        self.md_choices = Counter("sglang_pdd_router_md_choices", "MainDecode choices by site and the rule "
                                  "that decided (cache-aware, imbalanced, stale, least-loaded, ...)",
                                  ("site", "rule"), registry=self.registry)
        self.md_prompt_tokens = Counter("sglang_pdd_router_md_prompt_tokens", "Prompt tokens sent to MainDecode, "
                                        "by site and whether the chosen MD held them (hit) or not (miss)",
                                        ("site", "cached"), registry=self.registry)
        self.peer_load = Gauge("sglang_pdd_router_peer_load", "Each server's load as the router sees it "
                               "(the larger of its in-flight count here and its own running + queued gauges)",
                               ("role", "peer"), registry=self.registry)
        self.peer_out = Gauge("sglang_pdd_router_peer_out_of_service", "1 while the router keeps a server out of "
                              "service (ejected after failures, until a probe generate succeeds; or refused: it "
                              "answers without the role key), else 0",
                              ("role", "peer"), registry=self.registry)
        self.peer_busy = Gauge("sglang_pdd_router_peer_busy_fraction", "Each server's recent busy share of time, "
                               "from its scheduler's idle-time counter (10 s average; P's is the relay placement's "
                               "headroom input)", ("role", "peer"), registry=self.registry)
        self.peer_in_flight = Gauge("sglang_pdd_router_peer_in_flight", "This router's requests on each server",
                                    ("role", "peer"), registry=self.registry)
        self.md_view_seq = Gauge("sglang_pdd_router_md_kv_events_seq", "The last KV-event batch of each MainDecode "
                                 "(--main-kv-events) applied to this router's view of its cache (-1: none yet)",
                                 ("peer",), registry=self.registry)
        self.md_view_exact = Gauge("sglang_pdd_router_md_kv_events_exact", "1 while this router's view of a "
                                   "MainDecode's cache follows its KV events exactly, 0 while it is stale (a gap, a "
                                   "lost connection: its hits are then approximate)", ("peer",), registry=self.registry)
        self.migrations = Counter("sglang_pdd_router_migrations", "Requests re-issued after a role's failure, "
                                  "by cause and outcome (completed, failed; not-migrated: a failure that "
                                  "ended the request unmigrated)", ("cause", "outcome"), registry=self.registry)
        self.ttft = Histogram("sglang_pdd_router_ttft_seconds", "Time from a request's arrival at the router "
                              "to its first output token, by pipeline", ("pipeline",), buckets=TTFT_BUCKETS,
                              registry=self.registry)

        self.open_connections = Gauge("sglang_pdd_router_open_connections", "Client connections open now",
                                      registry=self.registry)
        self.in_flight = Gauge("sglang_pdd_router_in_flight", "Client requests being served now (not /health, "
                               "/metrics)", registry=self.registry)
        self.body_bytes = Gauge("sglang_pdd_router_body_bytes", "Bytes of request bodies the router holds now "
                                "(their budget: sglang_pdd_router_limit{limit=\"body-bytes\"})", registry=self.registry)
        self.tokenizer_queue = Gauge("sglang_pdd_router_tokenizer_queue", "Requests being parsed and tokenized "
                                     "or waiting for a tokenizer thread", registry=self.registry)
        self.limit = Gauge("sglang_pdd_router_limit", "The front door's configured limits (--max-connections, "
                           "--max-in-flight, --max-in-flight-per-client, tokenizer threads + --tokenizer-queue, "
                           "--max-body-mb-in-flight in bytes, grammar compiles running or waiting: --grammar-workers x 5)",
                           ("limit",), registry=self.registry)
        self.refused = Counter("sglang_pdd_router_refused", "Connections and requests the front door refused or "
                               "closed, by reason (" + ", ".join(REFUSALS) + ")", ("reason",),
                               registry=self.registry)
        self.relay_decisions = Counter("sglang_pdd_router_relay_decisions", "Requests placed by the relay policy "
                                       "(--ttft-slo-secs), by where the relay runs (none: P->MD; pool: an RLD; "
                                       "p: on P) and the rule that decided (" + ", ".join(RULES) + ")",
                                       ("placement", "rule"), registry=self.registry)
        self.pool_target = Gauge("sglang_pdd_router_relay_pool_target", "The relay pool's scale signal: the "
                                 "RelayDecode instances this router's recent traffic pays for (an HPA's or KEDA's "
                                 "target; peers.relay_pool_signal)", registry=self.registry)
        self.pool_at_risk = Gauge("sglang_pdd_router_relay_pool_at_risk_share", "The share of the requests placed "
                                  "over the signal's window whose TTFT the line would put over the SLA",
                                  registry=self.registry)
        for placement in Placement:
            for rule in RULES:
                self.relay_decisions.labels(placement.value, rule)
        for reason in REFUSALS:  # every reason is a series from the start (rate() needs a zero)
            self.refused.labels(reason)
        for name in LIMITS:
            self.limit.labels(name)

    def chose(self, outcome: Outcome) -> None:
        mc = outcome.main_choice
        if mc is None:
            return
        site = mc.site or "default"
        self.md_choices.labels(site, mc.kind).inc()
        self.md_prompt_tokens.labels(site, "hit").inc(min(mc.hit, mc.prompt_len))
        self.md_prompt_tokens.labels(site, "miss").inc(max(mc.prompt_len - mc.hit, 0))

    def record(self, outcome: Outcome, ok: bool, n_tokens: int) -> None:
        pipe = outcome.pipeline.value if outcome.pipeline else "none"
        self.requests.labels(pipe, "ok" if ok else "error").inc()
        handoff_tokens = min(outcome.handoff_tokens or 0, n_tokens)
        relay_tokens = n_tokens if (outcome.pipeline and outcome.pipeline.value != "P->MD"
                                    and outcome.handoff_tokens is None) else handoff_tokens
        self.tokens.labels("relay").inc(relay_tokens)
        self.tokens.labels("main").inc(n_tokens - relay_tokens)
        if outcome.handoff_tokens is not None:
            self.handoffs.labels(outcome.handoff_mode or "unknown").inc()
        if outcome.relay_target is not None:
            self.relayed.labels(outcome.relay_target).inc()
        for cause in outcome.migrations:
            self.migrations.labels(cause, "completed" if ok else "failed").inc()
        if not ok and outcome.unmigrated is not None:
            self.migrations.labels(outcome.unmigrated, "not-migrated").inc()
        if outcome.rule:
            self.relay_decisions.labels(outcome.placement, outcome.rule).inc()
        if ok and outcome.pipeline and outcome.pipeline.value == "P->RLD" and outcome.missed_bytes:
            self.avoided.labels(_relay_alone_kind(outcome.reason)).inc(outcome.missed_bytes)
