"""examples/monitoring's alerting rules are rule files Prometheus loads: alerts.yml and the PrometheusRule's
spec (kubernetes/prometheusrule.yaml), each refused or accepted as a whole, as Prometheus does at load.

`promtool check rules` decides where promtool is on the PATH. It is not installed for CI: Debian's only
package of it is the whole Prometheus server (`prometheus`: 19 MB to fetch, 96 MB installed, with a
daemon and a web UI's libraries) and PyPI has none. Everywhere, this module reads the files as
Prometheus' rulefmt does: only the keys it knows, one `alert` or `record` per rule, durations, label
and annotation names, templates whose actions are the ones these rules use, and every expression
parsed and type-checked by promql-parser (the Rust `promql-parser` crate, a port of Prometheus' own
parser: requirements/dev.txt). It also checks what promtool does not: a template's `$labels.X` is a
label the expression's result has (after `max by (site, peer)`, `$labels.instance` is always empty)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess

import pytest
import yaml

from .conftest import EXAMPLES

HERE = os.path.join(EXAMPLES, "monitoring")
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RECORD = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
DURATION = re.compile(r"^((\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?|0)$")
GROUP_KEYS = {"name", "interval", "query_offset", "limit", "labels", "rules"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
# the template actions these rules use: a label, the value, piped through one of Prometheus' functions
ACTION = re.compile(r"^\s*(\$labels\.(?P<label>[a-zA-Z_]\w*)|\$value|\$externalLabels\.\w+)"
                    r"(\s*\|\s*(humanize|humanize1024|humanizePercentage|humanizeDuration|printf \"[^\"]*\"))*\s*$")


def rule_files() -> dict[str, dict]:
    with open(os.path.join(HERE, "alerts.yml")) as f:
        alerts = yaml.safe_load(f)
    with open(os.path.join(HERE, "kubernetes", "prometheusrule.yaml")) as f:
        spec = yaml.safe_load(f)["spec"]
    return {"alerts.yml": alerts, "kubernetes/prometheusrule.yaml (spec)": spec}


def output_labels(expr) -> set[str] | None:
    """The labels an expression's result can carry, where its shape says so (an aggregation `by`);
    None where it keeps its series' labels (a selector, a function, `without`)."""
    import promql_parser as pq

    if isinstance(expr, pq.AggregateExpr):
        m = expr.modifier
        if m is None:
            return set()
        return set(m.labels) if str(m).startswith("by") else None
    if isinstance(expr, pq.BinaryExpr):  # the vector side's (lhs's when both are: one-to-one matching)
        return output_labels(expr.rhs if isinstance(expr.lhs, pq.NumberLiteral) else expr.lhs)
    if isinstance(expr, (pq.ParenExpr, pq.UnaryExpr)):
        return output_labels(expr.expr)
    return None


def _templates(where: str, values: dict, labels: set[str] | None) -> list[str]:
    problems = []
    for k, v in values.items():
        if not NAME.match(str(k)):
            problems.append(f"{where}: invalid name {k!r}")
        if not isinstance(v, str):
            problems.append(f"{where}.{k}: not a string")
            continue
        if v.count("{{") != v.count("}}") or re.search(r"\}\}[^{]*\}\}|\{\{[^}]*\{\{", v):
            problems.append(f"{where}.{k}: unbalanced template braces")
            continue
        for action in re.findall(r"\{\{(.*?)\}\}", v, re.S):
            m = ACTION.match(action)
            if not m:
                problems.append(f"{where}.{k}: template action {{{{{action}}}}} not understood")
            elif m["label"] and labels is not None and m["label"] not in labels:
                problems.append(f"{where}.{k}: $labels.{m['label']} is not a label of the expression's result "
                                f"(it has {sorted(labels)})")
    return problems


def rule_file_problems(doc) -> list[str]:
    """What Prometheus (and the checks above) would refuse in a rule file's content; [] when none."""
    import promql_parser as pq

    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the file must hold `groups:` (a list) and nothing else"]
    problems, names = [], set()
    for g in doc["groups"]:
        if not isinstance(g, dict) or set(g) - GROUP_KEYS or not g.get("name") or not isinstance(g.get("rules"), list):
            problems.append(f"group {g!r:.60}: keys {sorted(GROUP_KEYS)}, a name and a list of rules")
            continue
        if g["name"] in names:
            problems.append(f"group {g['name']}: repeated")
        names.add(g["name"])
        for key in ("interval", "query_offset"):
            if key in g and not DURATION.match(str(g[key])):
                problems.append(f"group {g['name']}: {key} {g[key]!r} is not a duration")
        for i, r in enumerate(g["rules"]):
            where = f"{g['name']}[{i}] {r.get('alert') or r.get('record') if isinstance(r, dict) else r!r}"
            if not isinstance(r, dict) or set(r) - RULE_KEYS:
                problems.append(f"{where}: unknown keys {sorted(set(r) - RULE_KEYS) if isinstance(r, dict) else r}")
                continue
            if ("alert" in r) == ("record" in r):
                problems.append(f"{where}: one of alert or record")
                continue
            if "record" in r and (not RECORD.match(str(r["record"])) or {"for", "keep_firing_for", "annotations"} & set(r)):
                problems.append(f"{where}: a recording rule's name, and no for, keep_firing_for or annotations")
            if "alert" in r and not str(r["alert"]).strip():
                problems.append(f"{where}: an empty alert name")
            for key in ("for", "keep_firing_for"):
                if key in r and not DURATION.match(str(r[key])):
                    problems.append(f"{where}: {key} {r[key]!r} is not a duration")
            if not isinstance(r.get("expr"), str) or not r["expr"].strip():
                problems.append(f"{where}: no expr")
                continue
            try:
                labels = output_labels(pq.parse(r["expr"]))
            except ValueError as e:
                problems.append(f"{where}: expr: {e}")
                continue
            for key in ("labels", "annotations"):
                values = r.get(key) or {}
                if not isinstance(values, dict):
                    problems.append(f"{where}: {key} must be a mapping")
                    continue
                problems += _templates(f"{where}.{key}", values, labels)
    return problems


def test_every_rule_file_is_valid():
    files = rule_files()
    for name, doc in files.items():
        assert rule_file_problems(doc) == [], name
    assert sum(len(g["rules"]) for g in files["alerts.yml"]["groups"]) >= 8


def _broken(edit) -> dict:
    doc = copy.deepcopy(rule_files()["alerts.yml"])
    edit(doc["groups"][0]["rules"][0], doc)
    return doc


BROKEN = {
    "an unclosed parenthesis": (lambda r, d: r.update(expr="sum(rate(x[5m])"), "unclosed left parenthesis"),
    "a function's wrong argument type": (lambda r, d: r.update(expr="rate(up) > 0"), "expected type matrix"),
    "an unknown function": (lambda r, d: r.update(expr="rates(up[5m]) > 0"), "unknown function"),
    "a bad duration": (lambda r, d: r.update({"for": "10 minutes"}), "is not a duration"),
    "a misspelt key": (lambda r, d: r.update(annotation={"summary": "x"}), "unknown keys"),
    "alert and record": (lambda r, d: r.update(record="x:y"), "one of alert or record"),
    "a repeated group": (lambda r, d: d["groups"].append(copy.deepcopy(d["groups"][0])), "repeated"),
    "an unbalanced template": (lambda r, d: r["annotations"].update(summary="{{ $labels.instance }"), "unbalanced"),
    "a label the result lacks": (lambda r, d: r.update(expr="max by (site) (up) == 0"),
                                 "$labels.instance is not a label of the expression's result"),
    "a bad label name": (lambda r, d: r["labels"].update({"sev-erity": "x"}), "invalid name"),
    "a key beside groups": (lambda r, d: d.update(rules=[]), "nothing else"),
}


@pytest.mark.parametrize("why", sorted(BROKEN))
def test_the_check_refuses_a_broken_rule_file(why):
    edit, message = BROKEN[why]
    problems = rule_file_problems(_broken(edit))
    assert any(message in p for p in problems), (why, problems)


def test_promtool_where_installed_else_the_parser_accepts_the_files_and_refuses_a_broken_one(tmp_path, figures):
    """One verdict per file from promtool where it is installed (nothing is skipped where it is not: the
    parser's verdict stands, as in every run), with the same broken file refused as the control."""
    files = {**{f"ok-{i}.yml": doc for i, doc in enumerate(rule_files().values())},
             "broken.yml": _broken(BROKEN["an unclosed parenthesis"][0])}
    promtool = shutil.which("promtool")
    verdicts = {}
    for name, doc in files.items():
        if promtool is None:
            verdicts[name] = not rule_file_problems(doc)
            continue
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        verdicts[name] = r.returncode == 0
    assert verdicts == {name: not name.startswith("broken") for name in files}, verdicts
    figures.append(f"examples/monitoring rule files: checked by {'promtool' if promtool else 'promql-parser'}")
