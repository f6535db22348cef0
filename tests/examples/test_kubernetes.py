"""examples/kubernetes: the overlays render (the lite renderer, and kubectl kustomize where installed) to
the committed rendered/ files, every document validates against the Kubernetes schemas offline
(kubernetes-validate, strict: unknown fields fail), and the manifests do what the README promises:
one site per overlay (and each pod labelled with it, for Prometheus' `site`), probes (liveness never
asks a peer: the router's /live, the roles' /health without sglang's generate; readiness: the router's
/ready, the roles' /health_generate), Prometheus annotations, the secret mounted from a Secret and
named by SGLANG_PDD_SECRET_FILE, decode roles at TP 1 on sglang's default overlap scheduler streaming
incrementally, and every flag known to sglang's parser, the plugin and the router."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import types

import pytest
import yaml

from sglang_pdd import config, supported

from .conftest import EXAMPLES
from .kustomize_lite import apply_op, render

K8S = os.path.join(EXAMPLES, "kubernetes")
SITES = {"site-a": {"pdd-prefill", "pdd-relay", "pdd-router"}, "site-b": {"pdd-main"}}
KUBERNETES_VERSION = "1.30.0"  # the oldest minor still maintained upstream when written; strict schemas


def key(d: dict) -> tuple[str, str]:
    return d["kind"], d["metadata"]["name"]


def committed(site: str) -> dict:
    with open(os.path.join(K8S, "rendered", f"{site}.yaml")) as f:
        return {key(d): d for d in yaml.safe_load_all(f) if d}


@pytest.fixture(scope="module", params=sorted(SITES))
def site(request):
    return request.param, {key(d): d for d in render(os.path.join(K8S, "overlays", request.param))}


def test_the_overlay_renders_to_the_committed_file(site):
    name, docs = site
    assert docs == committed(name), f"regenerate: kubectl kustomize overlays/{name} > rendered/{name}.yaml"
    kubectl = shutil.which("kubectl")
    if kubectl:  # the lite renderer agrees with real kustomize
        out = subprocess.run([kubectl, "kustomize", os.path.join(K8S, "overlays", name)], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        assert {key(d): d for d in yaml.safe_load_all(out) if d} == docs


def test_every_document_validates_against_the_kubernetes_schemas(site):
    kv = pytest.importorskip("kubernetes_validate", reason="requirements/dev.txt pins kubernetes-validate")
    _, docs = site
    for d in docs.values():
        kv.validate(d, KUBERNETES_VERSION, strict=True)  # raises on an invalid document or a missing schema
    # negative control: a misspelt field fails
    bad = copy.deepcopy(next(d for d in docs.values() if d["kind"] == "Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, KUBERNETES_VERSION, strict=True)


def test_each_site_gets_its_roles_only(site):
    name, docs = site
    for d in deployments(docs):  # the label Prometheus' kubernetes-pods job and PodMonitor make `site` of
        assert d["spec"]["template"]["metadata"]["labels"]["sglang-pdd/site"] == name.removeprefix("site-")
    assert {n for k, n in docs if k == "Deployment"} == SITES[name]
    assert {n for k, n in docs if k == "Service"} == SITES[name]
    assert all(d["metadata"]["namespace"] == "sglang-pdd" for d in docs.values())
    assert not any(k == "Secret" for k, _ in docs), "the secret is created out of band, never committed"


def deployments(docs):
    return [d for (k, _), d in docs.items() if k == "Deployment"]


# liveness never asks a peer (a WAN cut must restart nothing); readiness: the router can serve (RLD alone
# counts), a role generates one token on a fake bootstrap. Roles' /health without its generate: pdd-settings.
PROBES = {True: {"livenessProbe": "/live", "readinessProbe": "/ready"},
          False: {"livenessProbe": "/health", "readinessProbe": "/health_generate", "startupProbe": "/health"}}


def test_liveness_never_depends_on_peers(site):
    from sglang.srt.environ import envs

    from sglang_pdd.lab.testing import fake_upstream as fu
    from sglang_pdd.router.app import RouterApp

    _, docs = site
    assert docs[("ConfigMap", "pdd-settings")]["data"]["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    assert hasattr(envs, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")  # sglang's name for it, still read
    app = RouterApp(types.SimpleNamespace(start=None, close=None), fu.CharTokenizer(), "m")
    routes = {r.resource.canonical for r in app.app.router.routes() if r.method == "GET"}
    assert set(PROBES[True].values()) <= routes and "/health" in routes


def test_probes_metrics_and_services(site):
    _, docs = site
    for d in deployments(docs):
        pod = d["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        http = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
        want = PROBES[d["metadata"]["labels"]["sglang-pdd/role"] == "router"]
        for probe, path in want.items():
            assert c[probe]["httpGet"] == {"path": path, "port": http}, (d["metadata"]["name"], probe)
        ann = pod["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == str(http)
        assert ann["prometheus.io/path"] == "/metrics"
        svc = docs[("Service", d["metadata"]["name"])]
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} == {p["containerPort"] for p in c["ports"]}


def resolved(container: dict, settings: dict) -> tuple[list[str], dict]:
    """The container's argv and environment with Kubernetes' $(VAR) references expanded."""
    env = dict(settings)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)
    return [_expand(a, env) for a in container["command"] + container["args"]], env


def _expand(s: str, env: dict) -> str:
    def sub(m):
        assert m.group(1) in env, f"$({m.group(1)}) is not defined"
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def test_every_flag_exists_and_the_decode_roles_run_tp1_on_the_overlap_loop(site, server_parser):
    from sglang_pdd.router.__main__ import build_parser

    _, docs = site
    settings = docs[("ConfigMap", "pdd-settings")]["data"]
    for d in deployments(docs):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert [r["configMapRef"]["name"] for r in c["envFrom"]] == ["pdd-settings"]
        argv, env = resolved(c, settings)
        role = d["metadata"]["labels"]["sglang-pdd/role"]
        if role == "router":
            args = build_parser().parse_args(argv[3:])
            assert args.main == [[f"http://{settings['PDD_MAIN_HOST']}:30002"]]
            assert args.prefill == [[f"http://{settings['PDD_PREFILL_HOST']}:30000", "8998"]]
            assert args.relay == [[f"http://{settings['PDD_RELAY_HOST']}:30001", "18500"]]
            continue
        ns = server_parser.parse_args(argv[3:])
        cfg = config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)
        assert cfg.role.value == role
        assert env["SGLANG_HOST_IP"] == settings[f"PDD_{role.upper()}_HOST"]
        assert d["spec"]["template"]["spec"]["hostNetwork"] is True
        if role in ("relay", "main"):
            assert ns.tp_size == 1 and not ns.disable_overlap_schedule, role  # sglang's default loop
            assert ns.incremental_streaming_output, role  # O(n) stream bytes; MD's stream crosses the WAN
        assert supported.unsupported(cfg, ns) == [], role
        if role == "main":  # MD trusts the relay the router names
            assert cfg.relay_set == {f"tcp://{settings['PDD_RELAY_HOST']}:18500"}


def test_the_secret_is_a_mounted_file(site):
    _, docs = site
    for d in deployments(docs):
        spec = d["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        role = d["metadata"]["labels"]["sglang-pdd/role"]
        names = {e["name"] for e in c.get("env", [])}
        assert "SGLANG_PDD_SECRET" not in names and not any("secret" in a.lower() for a in c["args"])
        # every role and the router: RLD and MD authenticate the token channel with it, the router
        # signs P's and MD's PDD parameters, P and MD verify them
        path = next(e["value"] for e in c["env"] if e["name"] == "SGLANG_PDD_SECRET_FILE")
        vol = next(v for v in spec["volumes"] if "secret" in v)
        mount = next(m for m in c["volumeMounts"] if m["name"] == vol["name"])
        assert mount["readOnly"] and vol["secret"]["secretName"] == "sglang-pdd-secret"
        assert vol["secret"]["defaultMode"] == 0o400
        (item,) = vol["secret"]["items"]
        assert path == os.path.join(mount["mountPath"], item["path"])


def test_json6902_operations_of_the_lite_renderer():
    doc = {"a": {"b": [1, 2]}, "c": {}}
    apply_op(doc, {"op": "add", "path": "/a/b/-", "value": 3})
    apply_op(doc, {"op": "add", "path": "/a/b/0", "value": 0})
    apply_op(doc, {"op": "replace", "path": "/a/b/1", "value": 9})
    apply_op(doc, {"op": "add", "path": "/c/x~1y", "value": "v"})
    apply_op(doc, {"op": "remove", "path": "/a/b/3"})
    assert doc == {"a": {"b": [0, 9, 2]}, "c": {"x/y": "v"}}
    with pytest.raises(KeyError):
        apply_op(doc, {"op": "replace", "path": "/c/missing", "value": 1})
