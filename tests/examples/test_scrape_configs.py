"""examples/monitoring's scrape configs: the static jobs cover the four roles with their `pdd_role` and
`site` and the alert rules are loaded; the `kubernetes-pods` job and the PodMonitor, applied (with
Prometheus' relabelling, simulated here) to the pods the Kubernetes overlays render, scrape exactly each
replica of P, RLD and MD and the router, each once, with its role and site, and nothing else."""

from __future__ import annotations

import os
import re

import yaml

from .conftest import EXAMPLES
from .kustomize_lite import render

HERE = os.path.join(EXAMPLES, "monitoring")
K8S = os.path.join(EXAMPLES, "kubernetes")
SCRAPE = {"pdd_role", "site"}


def prometheus_config() -> dict:
    with open(os.path.join(HERE, "prometheus.yml")) as f:
        return yaml.safe_load(f)


def test_the_static_jobs_cover_every_role_and_the_rules_are_loaded():
    cfg = prometheus_config()
    assert cfg["rule_files"] == ["alerts.yml"]
    roles = {}
    for job in cfg["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for sc in job.get("static_configs", []):
            assert sc["targets"] and all(re.fullmatch(r"[\w.-]+:\d+", t) for t in sc["targets"])
            assert set(sc["labels"]) == SCRAPE
            roles[sc["labels"]["pdd_role"]] = sc["labels"]["site"]
    assert roles == {"prefill": "a", "relay": "a", "router": "a", "main": "b"}


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


# the pods' addresses in this simulation: 10.<site>.<role>.<replica + 1> (hostNetwork: the node's)
SITE_NET, ROLE_NET = {"site-a": 1, "site-b": 2}, {"prefill": 1, "relay": 2, "main": 3, "router": 4}
PODS = {("10.1.1.1:30000", "prefill", "a"), ("10.1.1.2:30000", "prefill", "a"), ("10.1.2.1:30001", "relay", "a"),
        ("10.1.2.2:30001", "relay", "a"), ("10.1.4.1:8000", "router", "a"), ("10.2.3.1:30002", "main", "b"),
        ("10.2.3.2:30002", "main", "b")}  # every replica of the overlays' pools, once


def pod_targets() -> list[dict[str, str]]:
    """The discovered labels Prometheus' pod role gives each container port of each pod (each replica of
    each StatefulSet and Deployment) the overlays render, plus a pod of another app that must not be scraped."""
    out = []
    for site in ("site-a", "site-b"):
        docs = render(os.path.join(K8S, "overlays", site))
        for d in docs:
            if d["kind"] not in ("Deployment", "StatefulSet"):
                continue
            tpl = d["spec"]["template"]
            role = tpl["metadata"]["labels"]["sglang-pdd/role"]
            (c,) = tpl["spec"]["containers"]
            for i, port in ((i, port) for i in range(d["spec"]["replicas"]) for port in c["ports"]):
                ip = f"10.{SITE_NET[site]}.{ROLE_NET[role]}.{i + 1}"
                meta = {"__address__": f"{ip}:{port['containerPort']}", "__metrics_path__": "/metrics",
                        "__meta_kubernetes_namespace": d["metadata"]["namespace"],
                        "__meta_kubernetes_pod_name": f"{d['metadata']['name']}-{i}",
                        "__meta_kubernetes_pod_container_port_name": port["name"],
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}
                meta.update({f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in tpl["metadata"]["labels"].items()})
                meta.update({f"__meta_kubernetes_pod_annotation_{_sanitize(k)}": v
                             for k, v in tpl["metadata"].get("annotations", {}).items()})
                out.append(meta)
    out.append({"__address__": "10.9.9.9:9100", "__metrics_path__": "/metrics", "__meta_kubernetes_namespace": "sglang-pdd",
                "__meta_kubernetes_pod_name": "other", "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
                "__meta_kubernetes_pod_annotation_prometheus_io_port": "9100",
                "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "something-else"})
    return out


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus' relabelling (replace, keep, drop; anchored regexes, $N references); None when dropped.
    Accepts the scrape config's snake_case keys and the Prometheus Operator's camelCase ones."""
    labels = dict(labels)
    for c in configs:
        c = {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): v for k, v in c.items()}
        action = c.get("action", "replace")
        value = c.get("separator", ";").join(labels.get(s, "") for s in c.get("sourceLabels", []))
        m = re.fullmatch(c.get("regex", "(.*)"), value)
        if action == "keep" and not m or action == "drop" and m:
            return None
        if action == "replace" and m:
            new = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))) or "", c.get("replacement", "$1"))
            if new:
                labels[c["targetLabel"]] = new
            else:
                labels.pop(c["targetLabel"], None)
        assert action in ("replace", "keep", "drop"), action
    return labels


def test_the_kubernetes_pods_job_scrapes_each_role_once_with_its_role_and_site():
    (job,) = [j for j in prometheus_config()["scrape_configs"] if j["job_name"] == "kubernetes-pods"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["sglang-pdd"]}}]
    kept = [t for t in (relabel(p, job["relabel_configs"]) for p in pod_targets()) if t is not None]
    # one target per distinct address: Prometheus dedups the ports of a pod the address rewrite makes equal
    got = {(t["__address__"], t["__metrics_path__"], t["pdd_role"], t["site"]) for t in kept}
    assert got == {(addr, "/metrics", role, site) for addr, role, site in PODS}
    assert all(t["namespace"] == "sglang-pdd" and t["pod"].startswith("pdd-") for t in kept)


def test_the_pod_monitor_selects_the_pods_and_labels_them():
    with open(os.path.join(HERE, "kubernetes", "podmonitor.yaml")) as f:
        pm = yaml.safe_load(f)
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    spec = pm["spec"]
    (ep,) = spec["podMetricsEndpoints"]
    assert ep["path"] == "/metrics"
    chosen = []
    for p in pod_targets():
        pod_labels = {k: v for k, v in p.items() if k.startswith("__meta_kubernetes_pod_label_")}
        selected = all(pod_labels.get(f"__meta_kubernetes_pod_label_{_sanitize(k)}") == v
                       for k, v in spec["selector"]["matchLabels"].items())
        if (selected and p["__meta_kubernetes_namespace"] in spec["namespaceSelector"]["matchNames"]
                and p["__meta_kubernetes_pod_container_port_name"] == ep["port"]):
            chosen.append(relabel(p, ep["relabelings"]))
    got = {(t["__address__"], t["pdd_role"], t["site"]) for t in chosen}
    assert got == PODS
    assert len(chosen) == len(PODS)


def test_the_relabel_simulation_can_fail():
    cfg = [{"source_labels": ["a"], "action": "keep", "regex": "x"}, {"source_labels": ["b"], "target_label": "c"}]
    assert relabel({"a": "x", "b": "1"}, cfg) == {"a": "x", "b": "1", "c": "1"}
    assert relabel({"a": "xy", "b": "1"}, cfg) is None  # anchored
    assert relabel({"__address__": "1.2.3.4:80", "p": "9"}, [
        {"source_labels": ["__address__", "p"], "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
         "target_label": "__address__"}])["__address__"] == "1.2.3.4:9"
