"""examples/monitoring: every series the Grafana dashboard's PromQL names is exported by the code, with
the labels it groups or filters by, and the Prometheus config scrapes P, RLD, MD and the router.

Exported names are computed as prometheus_client exposes them: a Counter `x` as `x_total`, a Histogram
as `x_bucket`, `x_sum`, `x_count`, a Gauge as itself. The plugin's series come from the `_counter`/
`_gauge` calls in sglang_pdd/metrics.py (read from its source: registering them needs a scheduler); the
router's from a real `RouterMetrics` registry."""

from __future__ import annotations

import ast
import json
import os
import re

import yaml

from sglang_pdd import metrics

from .conftest import EXAMPLES

HERE = os.path.join(EXAMPLES, "monitoring")
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
# labels Prometheus adds (job, instance), the scrape config's target labels, a histogram's le
ADDED = {"job", "instance", "le"}
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "without", "avg", "max", "min", "irate", "increase"}


def plugin_series() -> dict[str, set[str]]:
    """{exported name: label names} of every _counter/_gauge call in sglang_pdd/metrics.py."""
    with open(metrics.__file__) as f:
        tree = ast.parse(f.read())
    catchup = {n for n, _ in metrics._CATCHUP.values()}  # _counter(name, ...) over this table
    # tuples of label names bound to a variable first (`labels = ("path", "kind", "peer")`)
    bound = {t.id: ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Tuple)}
    out = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("_counter", "_gauge")):
            continue
        kind = node.func.id[1:]
        arg = node.args[2]
        labels = set(bound[arg.id] if isinstance(arg, ast.Name) else ast.literal_eval(arg))
        first = node.args[0]
        names = [first.value] if isinstance(first, ast.Constant) else sorted(catchup)
        for n in names:
            for s in SUFFIXES[kind]:
                out[metrics.PREFIX + n + s] = labels
    return out


def router_series() -> dict[str, set[str]]:
    from sglang_pdd.router.app import RouterMetrics

    out = {}
    for fam in RouterMetrics().registry.collect():
        for s in SUFFIXES[fam.type]:
            out[fam.name + s] = set()
    # label names: from the samples after one observation of each (a labelled family has none before)
    return out


def exported() -> dict[str, set[str]]:
    from sglang_pdd.router.app import RouterMetrics

    m = RouterMetrics()
    m.requests.labels("P->MD", "ok").inc()
    m.tokens.labels("relay").inc()
    m.handoffs.labels("one-shot").inc()
    m.avoided.labels("odd-traffic").inc()
    m.ttft.labels("P->MD").observe(0.1)
    m.bandwidth.set(1)
    m.md_choices.labels("default", "cache-aware").inc()
    m.md_prompt_tokens.labels("default", "hit").inc()
    m.migrations.labels("unreachable", "completed").inc()
    m.peer_load.labels("main", "http://md:1").set(0)
    m.peer_in_flight.labels("main", "http://md:1").set(0)
    out = plugin_series()
    router = router_series()
    for fam in m.registry.collect():
        for sample in fam.samples:
            if sample.name in router:
                out.setdefault(sample.name, set()).update(sample.labels)
    missing = set(router) - set(out)
    assert not missing, f"router series without samples: {missing}"
    return out


def dashboard_exprs() -> list[str]:
    with open(os.path.join(HERE, "grafana-dashboard.json")) as f:
        dash = json.load(f)
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def scrape_labels() -> set[str]:
    with open(os.path.join(HERE, "prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    return {k for job in cfg["scrape_configs"] for sc in job["static_configs"] for k in sc.get("labels", {})}


def used_labels(expr: str) -> set[str]:
    by = {x.strip() for g in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for x in g.split(",")}
    matchers = {m for g in re.findall(r"\{([^}]*)\}", expr) for m in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!=|!~|=)", g)}
    return (by | matchers) - {""}


def test_the_exported_names_follow_prometheus_client():
    series = exported()
    assert "sglang_pdd_router_ttft_seconds_bucket" in series and "sglang_pdd_router_ttft_seconds" not in series
    assert "sglang_pdd_transfer_bytes_total" in series and "sglang_pdd_handoff_held_requests" in series
    assert series["sglang_pdd_router_ttft_seconds_bucket"] == {"pipeline", "le"}


def test_every_series_the_dashboard_names_is_exported():
    series = exported()
    exprs = dashboard_exprs()
    assert exprs
    used = set()
    for e in exprs:
        names = set(re.findall(r"\bsglang_pdd_\w+", e))
        assert names, f"no sglang_pdd_* series in {e!r}"
        unknown = names - set(series)
        assert not unknown, f"{e!r} names series the code does not export: {unknown}"
        # every label it groups or filters by exists on every series it names (or is added by Prometheus)
        allowed = ADDED | scrape_labels()
        for n in names:
            bad = used_labels(e) - series[n] - allowed
            assert not bad, f"{e!r}: {n} has no label {bad}"
        used |= names
    # what the dashboard is for
    for must in ("sglang_pdd_router_ttft_seconds_bucket", "sglang_pdd_handoffs_total",
                 "sglang_pdd_router_handoffs_total", "sglang_pdd_transfer_bytes_total",
                 "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second", "sglang_pdd_handoff_held_requests"):
        assert must in used, must


def test_the_scrape_config_covers_every_role():
    with open(os.path.join(HERE, "prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    roles = {}
    for job in cfg["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for sc in job["static_configs"]:
            assert sc["targets"] and all(re.fullmatch(r"[\w.-]+:\d+", t) for t in sc["targets"])
            roles[sc["labels"]["pdd_role"]] = sc["labels"]["site"]
    assert roles == {"prefill": "a", "relay": "a", "router": "a", "main": "b"}


def test_the_label_check_can_fail():
    assert used_labels('sum by (le, pipeline) (rate(x{role="main", kind!="y"}[5m]))') == {"le", "pipeline", "role", "kind"}
    assert plugin_series()["sglang_pdd_handoffs_total"] == {"role"}
    assert plugin_series()["sglang_pdd_transfer_bytes_total"] == {"path", "kind", "peer"}
