"""examples/monitoring: every series the Grafana dashboard's and the alerts' PromQL names is exported by the
code (the plugin's and the router's `sglang_pdd_*`) or by the installed sglang (`sglang:*`), with the
labels it groups or filters by; the dashboard filters and groups by role and site; the alerts the issue
asks for exist, and the PrometheusRule carries exactly alerts.yml's groups (the scrape configs that give
every series its `pdd_role` and `site`: test_scrape_configs.py).

Exported names are computed as prometheus_client exposes them: a Counter `x` as `x_total`, a Histogram
as `x_bucket`, `x_sum`, `x_count`, a Gauge as itself. The plugin's series come from the `_counter`/
`_gauge` calls in sglang_pdd/server/metrics.py (read from its source: registering them needs a scheduler); the
router's from a real `RouterMetrics`; sglang's from the metric constructors in the installed sglang's
observability package (read from its source)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re

import pytest
import yaml

from sglang_pdd.server import metrics

from .conftest import EXAMPLES

HERE = os.path.join(EXAMPLES, "monitoring")
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", "")}
# labels Prometheus adds (job, instance), a histogram's le
ADDED = {"job", "instance", "le"}
SCRAPE = {"pdd_role", "site"}  # the target labels every series gets (static jobs, kubernetes-pods, PodMonitor)
NOT_OURS = {"up"}  # Prometheus' own series
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "without", "avg", "max", "min", "irate", "increase"}
ROLES = {"prefill", "relay", "main", "router"}


# -- what the code exports ----------------------------------------------------------------------------
def plugin_series() -> dict[str, set[str]]:
    """{exported name: label names} of every _counter/_gauge call in sglang_pdd/server/metrics.py."""
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
    """{exported name: label names} of every metric of a real RouterMetrics."""
    from prometheus_client.metrics import MetricWrapperBase

    from sglang_pdd.router.metrics import RouterMetrics

    out = {}
    for m in vars(RouterMetrics()).values():
        if isinstance(m, MetricWrapperBase):
            for s in SUFFIXES[m._type]:
                out[m._name + s] = set(m._labelnames) | ({"le"} if s == "_bucket" else set())
    return out


def exported() -> dict[str, set[str]]:
    return {**plugin_series(), **router_series()}


@functools.lru_cache(maxsize=1)
def sglang_series() -> frozenset[str]:
    """Exported names of every `sglang:` metric the installed sglang constructs (its observability package;
    read from the source, without importing sglang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang not installed")
    d = os.path.join(os.path.dirname(spec.origin), "srt", "observability")
    assert os.path.exists(os.path.join(d, "metrics_collector.py")), d
    out = set()
    for f in sorted(os.listdir(d)):
        if not f.endswith(".py"):
            continue
        with open(os.path.join(d, f)) as fh:
            tree = ast.parse(fh.read())
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            kind = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
            if kind not in ("Counter", "Gauge", "Histogram", "Summary"):
                continue
            name = next((k.value.value for k in n.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)),
                        n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else None)
            if isinstance(name, str) and name.startswith("sglang:"):
                base = name.removesuffix("_total") if kind == "Counter" else name
                out |= {base + s for s in SUFFIXES[kind.lower()]}
    return frozenset(out)


# -- what the dashboard and the alerts use --------------------------------------------------------------
def dashboard() -> dict:
    with open(os.path.join(HERE, "grafana-dashboard.json")) as f:
        return json.load(f)


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def alerts() -> dict:
    with open(os.path.join(HERE, "alerts.yml")) as f:
        return yaml.safe_load(f)


def alert_rules() -> dict[str, dict]:
    return {r["alert"]: r for g in alerts()["groups"] for r in g["rules"]}


def names_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(sglang_pdd_\w+|sglang:\w+)", expr)) | (set(re.findall(r"\b\w+\b(?=\{)", expr)) & NOT_OURS)


def used_labels(expr: str) -> set[str]:
    by = {x.strip() for g in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for x in g.split(",")}
    matchers = {m for g in re.findall(r"\{([^}]*)\}", expr) for m in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!=|!~|=)", g)}
    return (by | matchers) - {""}


def scraped(labels: set[str]) -> set[str]:
    """A series' labels as Prometheus stores them: a label the scrape also sets becomes exported_<name>."""
    return {f"exported_{n}" if n in SCRAPE else n for n in labels} | SCRAPE | ADDED


def balanced(expr: str) -> bool:
    stack, pairs = [], {")": "(", "}": "{", "]": "["}
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if ch in "({[":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def check_exprs(exprs: list[str]) -> set[str]:
    """Every series an expression names exists, with every label it groups or filters by; returns the names."""
    ours, theirs = exported(), sglang_series()
    used = set()
    for e in exprs:
        assert balanced(e), f"unbalanced brackets or quotes: {e!r}"
        names = names_in(e)
        assert names, f"no sglang_pdd_*, sglang:* or Prometheus series in {e!r}"
        unknown = {n for n in names if n.startswith("sglang_pdd_") and n not in ours}
        assert not unknown, f"{e!r} names series the code does not export: {unknown}"
        unknown = {n for n in names if n.startswith("sglang:") and n not in theirs}
        assert not unknown, f"{e!r} names sglang series the installed sglang does not have: {unknown}"
        for n in names:
            # sglang's and Prometheus' own series: grouped and filtered by the scrape's labels only here
            allowed = scraped(ours[n]) if n in ours else SCRAPE | ADDED
            bad = used_labels(e) - allowed
            assert not bad, f"{e!r}: {n} has no label {bad}"
        used |= names
    return used


# -- the dashboard ----------------------------------------------------------------------------------------
def test_the_exported_names_follow_prometheus_client():
    series = exported()
    assert "sglang_pdd_router_ttft_seconds_bucket" in series and "sglang_pdd_router_ttft_seconds" not in series
    assert "sglang_pdd_transfer_bytes_total" in series and "sglang_pdd_handoff_held_requests" in series
    assert series["sglang_pdd_router_ttft_seconds_bucket"] == {"pipeline", "le"}
    theirs = sglang_series()
    assert {"sglang:num_running_reqs", "sglang:time_to_first_token_seconds_bucket",
            "sglang:prompt_tokens_total"} <= theirs
    assert "sglang:prompt_tokens_total_total" not in theirs and "sglang:time_to_first_token_seconds" not in theirs


def test_every_series_the_dashboard_names_is_exported():
    used = check_exprs(dashboard_exprs())
    # what the dashboard is for: PDD's own series ...
    for must in ("sglang_pdd_router_ttft_seconds_bucket", "sglang_pdd_handoffs_total",
                 "sglang_pdd_router_handoffs_total", "sglang_pdd_transfer_bytes_total",
                 "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second", "sglang_pdd_handoff_held_requests",
                 "sglang_pdd_router_migrations_total", "sglang_pdd_router_peer_load"):
        assert must in used, must
    # ... and sglang's own beside them
    for must in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                 "sglang:num_decode_prealloc_queue_reqs", "sglang:num_transfer_failed_reqs_total"):
        assert must in used, must


def test_the_dashboard_is_by_role_and_site():
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name in ("site", "pdd_role"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["multi"] and name in v["query"]["query"]
    for e in dashboard_exprs():
        for m in re.finditer(r"\b(sglang_pdd_\w+|sglang:\w+)\{([^}]*)\}", e):  # every selector, every panel
            assert 'site=~"$site"' in m.group(2) and 'pdd_role=~"$pdd_role"' in m.group(2), e
        assert not re.search(r"\b(sglang_pdd_\w+|sglang:\w+)(?![\w{])", e), f"a selector without the filters: {e!r}"
    # sglang's series (one server each) are grouped by role and site wherever they are aggregated
    for e in dashboard_exprs():
        if "sglang:" in e:
            for group in re.findall(r"\bby \(([^)]*)\)", e):
                assert {"site", "pdd_role"} <= {x.strip() for x in group.split(",")}, e


def test_the_label_check_can_fail():
    assert used_labels('sum by (le, pipeline) (rate(x{role="main", kind!="y"}[5m]))') == {"le", "pipeline", "role", "kind"}
    assert plugin_series()["sglang_pdd_handoffs_total"] == {"role"}
    assert plugin_series()["sglang_pdd_transfer_bytes_total"] == {"path", "kind", "peer"}
    with pytest.raises(AssertionError, match="does not export"):
        check_exprs(['sum(rate(sglang_pdd_router_requests{pdd_role="router"}[5m]))'])  # no _total
    with pytest.raises(AssertionError, match="installed sglang does not have"):
        check_exprs(["sum(sglang:num_running_requests)"])
    with pytest.raises(AssertionError, match="has no label"):
        check_exprs(["sum by (role) (sglang:num_running_reqs)"])  # sglang's series have no `role`
    with pytest.raises(AssertionError, match="has no label"):  # the router's own site is exported_site
        check_exprs(["sum by (rule) (rate(sglang_pdd_router_md_choices_total{exported_site=\"b\"}[5m]))",
                     "sum by (site, cached) (rate(sglang_pdd_router_md_prompt_tokens_total[5m]))",
                     "sum by (cached) (rate(sglang_pdd_router_md_prompt_tokens_total{state=\"x\"}[5m]))"])
    with pytest.raises(AssertionError, match="unbalanced"):
        check_exprs(["sum(rate(sglang_pdd_router_requests_total[5m])"])


# -- the alerts --------------------------------------------------------------------------------------------
def test_every_series_the_alerts_name_is_exported_and_the_asked_alerts_exist():
    rules = alert_rules()
    check_exprs([r["expr"] for r in rules.values()])
    for r in rules.values():
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0s")), r["alert"]
    # WAN bandwidth collapse, migration rate, peer ejected, handoff timeouts, RLD saturation, MD queue
    by_series = {
        "PddWanBandwidthCollapsed": "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second",
        "PddHighMigrationRate": "sglang_pdd_router_migrations_total",
        "PddPeerFailing": "sglang_pdd_router_migrations_total",
        "PddHandoffTimeouts": "sglang_pdd_handoff_failures_total",
        "PddRelaySaturated": "sglang:token_usage",
        "PddMainQueueGrowing": "sglang:num_decode_prealloc_queue_reqs",
    }
    for alert, series in by_series.items():
        assert series in rules[alert]["expr"], alert
    assert 'pdd_role="relay"' in rules["PddRelaySaturated"]["expr"]
    assert 'pdd_role="main"' in rules["PddMainQueueGrowing"]["expr"]


def test_the_label_values_the_alerts_match_are_the_codes():
    from sglang_pdd.router.request.migration.rules import CAUSES

    rules = alert_rules()
    causes = re.search(r'cause=~"([^"]+)"', rules["PddPeerFailing"]["expr"]).group(1).split("|")
    assert causes and set(causes) <= set(CAUSES), set(causes) - set(CAUSES)
    for r in rules.values():
        for values in re.findall(r'pdd_role=~?"([^"]+)"', r["expr"]):
            assert set(values.split("|")) <= ROLES, r["alert"]
    # MD's handoff timeouts are its failures whose reason says "within" (decode/main/handoff.py's messages)
    assert 'reason=~".*within.*"' in rules["PddHandoffTimeouts"]["expr"]
    spec = importlib.util.find_spec("sglang_pdd.decode.main.handoff")
    with open(spec.origin) as f:
        reasons = re.findall(r'self\._fail\(\w+, f"pdd: ([^"]*)"\)', f.read())
    timeouts = [r for r in reasons if "within" in r]
    assert len(timeouts) >= 3 and all(r.index("within") < 40 for r in timeouts)  # the label keeps 40 characters


def test_the_prometheus_rule_carries_the_alert_file():
    with open(os.path.join(HERE, "kubernetes", "prometheusrule.yaml")) as f:
        rule = yaml.safe_load(f)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == alerts(), "regenerate kubernetes/prometheusrule.yaml's spec from alerts.yml"
