"""examples/kubernetes, the RLD pool's autoscaler (README, "An elastic relay pool"): site A's HPA, KEDA's
alternative and prometheus-adapter's rule follow the router's scale signal and agree with its flags."""

from __future__ import annotations

import os
import re

import yaml

from .test_kubernetes import K8S, rendered, role_argvs


def test_the_relay_pool_follows_the_routers_scale_signal():
    """Site A's RLD StatefulSet is scaled by an HPA on the router's scale signal (an external metric the
    router exports, replicas = its value) between one and the replicas the router names, which runs the relay
    placement (--ttft-slo-secs: the signal is off without it); KEDA's alternative and prometheus-adapter's rule
    agree on the workload, the bounds and the metric."""
    from sglang_pdd.router.__main__ import _peer_args, _relay_pool_scale, build_parser
    from sglang_pdd.router.metrics import RouterMetrics

    docs = rendered("site-a")
    (router,) = [argv for d, _, argv, _ in role_argvs(docs) if d["metadata"]["name"] == "pdd-router"]
    args = build_parser().parse_args(router[3:])
    relays = len(_peer_args(args.relay, "relay", None, "--relay"))
    assert args.ttft_slo_secs > 0 and _relay_pool_scale(args, relays).max_instances == relays
    exported = {m.name for m in RouterMetrics().registry.collect()}
    (hpa,) = [d for (k, _), d in docs.items() if k == "HorizontalPodAutoscaler"]
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "pdd-relay"}
    assert ("StatefulSet", "pdd-relay") in docs and 1 == spec["minReplicas"] < spec["maxReplicas"] == relays
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"]["name"] in exported
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}  # replicas = the target
    assert not [d for (k, _), d in rendered("site-a-lws").items() if k == "HorizontalPodAutoscaler"]  # StatefulSet only

    with open(os.path.join(K8S, "autoscaling", "keda-scaledobject.yaml")) as f:
        keda = yaml.safe_load(f)
    assert keda["spec"]["scaleTargetRef"] == spec["scaleTargetRef"]
    assert (keda["spec"]["minReplicaCount"], keda["spec"]["maxReplicaCount"]) == (0, relays)
    (trigger,) = keda["spec"]["triggers"]
    assert re.search(r"\b(\w+)\{", trigger["metadata"]["query"]).group(1) in exported
    assert (trigger["metadata"]["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "1")
    with open(os.path.join(K8S, "autoscaling", "prometheus-adapter-rules.yaml")) as f:
        (rule,) = yaml.safe_load(f)["rules"]["external"]
    assert rule["name"]["as"] == metric["external"]["metric"]["name"] and rule["name"]["as"] in rule["metricsQuery"]
