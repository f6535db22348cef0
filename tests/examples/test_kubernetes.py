"""examples/kubernetes: the overlays render (the lite renderer, and kubectl kustomize where installed) to
the committed rendered/ files, every document validates against the Kubernetes schemas offline
(kubernetes-validate, strict: unknown fields fail; a LeaderWorkerSet against the LWS CRD's schema and its
pod templates against Kubernetes'), and the manifests do what the README promises: one site per overlay
(and each pod labelled with it, for Prometheus' `site`), P, RLD and MD as replicated pools (StatefulSets,
or LeaderWorkerSet groups in the LWS variant) whose every replica the router is given by a DNS name both
sites resolve, and no static address anywhere; probes (liveness never asks a peer: the router's /live,
the roles' /health without sglang's generate; readiness: the router's /ready, the roles'
/health_generate), Prometheus annotations, decode roles on sglang's default overlap scheduler streaming
incrementally (TP 1; TP 2 over two nodes in the LWS variant), and every flag known to sglang's parser, the
plugin and the router. Locked by default (issue 47 item 4): every key is a file of the Secret, each pod
mounting exactly the files it reads, every role runs sglang's --api-key through --config with the key the
router holds, RLD and MD encrypt the token channel (--pdd-token-curve=on), each role's flags pass the
plugin's start-up checks against files `protocol.keygen` wrote, and the README's `kubectl create secret`
commands create what the pods mount; every container requests cpu and memory (GPU roles Guaranteed, the
router Burstable); a NetworkPolicy admits every port each workload serves, and nothing else names an
address but its placeholder node CIDRs."""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import shutil
import subprocess
import types

import pytest
import yaml

from sglang_pdd import config
from sglang_pdd.server import supported

from sglang_pdd.protocol import keygen

from .conftest import EXAMPLES
from .kustomize_lite import apply_op, render
from .server_argv import parse_server

K8S = os.path.join(EXAMPLES, "kubernetes")
HERE = os.path.dirname(os.path.abspath(__file__))
# per overlay: its site and the workloads it runs
SITES = {"site-a": ("a", {"pdd-prefill", "pdd-relay", "pdd-router"}), "site-b": ("b", {"pdd-main"}),
         "site-a-lws": ("a", {"pdd-prefill", "pdd-relay", "pdd-router"}), "site-b-lws": ("b", {"pdd-main"})}
VARIANTS = {"statefulset": ("site-a", "site-b"), "lws": ("site-a-lws", "site-b-lws")}
WORKLOADS = ("Deployment", "StatefulSet", "LeaderWorkerSet")
KUBERNETES_VERSION = "1.30.0"  # the oldest minor still maintained upstream when written; strict schemas
LWS_API = "leaderworkerset.x-k8s.io/v1"


def key(d: dict) -> tuple[str, str]:
    return d["kind"], d["metadata"]["name"]


def committed(site: str) -> dict:
    with open(os.path.join(K8S, "rendered", f"{site}.yaml")) as f:
        return {key(d): d for d in yaml.safe_load_all(f) if d}


def rendered(site: str) -> dict:
    return {key(d): d for d in render(os.path.join(K8S, "overlays", site))}


@pytest.fixture(scope="module", params=sorted(SITES))
def site(request):
    return request.param, rendered(request.param)


def pod_templates(d: dict) -> list[tuple[str, dict]]:
    """(what, pod template) of a workload: 'pod' for a Deployment's or StatefulSet's, 'leader' and
    'worker' for a LeaderWorkerSet's."""
    if d["kind"] == "LeaderWorkerSet":
        t = d["spec"]["leaderWorkerTemplate"]
        return [("leader", t["leaderTemplate"]), ("worker", t["workerTemplate"])]
    return [("pod", d["spec"]["template"])]


def workloads(docs: dict) -> list[dict]:
    return [d for (k, _), d in docs.items() if k in WORKLOADS]


def templates(docs: dict):
    for d in workloads(docs):
        for what, tpl in pod_templates(d):
            yield d, what, tpl


def test_the_overlay_renders_to_the_committed_file(site):
    name, docs = site
    assert docs == committed(name), f"regenerate: kubectl kustomize overlays/{name} > rendered/{name}.yaml"
    kubectl = shutil.which("kubectl")
    if kubectl:  # the lite renderer agrees with real kustomize
        out = subprocess.run([kubectl, "kustomize", os.path.join(K8S, "overlays", name)], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        assert {key(d): d for d in yaml.safe_load_all(out) if d} == docs


def validate(d: dict) -> None:
    """Raises on an invalid document: Kubernetes' kinds by kubernetes-validate (strict), a LeaderWorkerSet
    by the LWS CRD's schema (strict, schemas/leaderworkerset-v1.json) and each of its pod templates as a
    Kubernetes PodTemplate (strict)."""
    import jsonschema
    import kubernetes_validate as kv

    if d.get("apiVersion") != LWS_API:
        kv.validate(d, KUBERNETES_VERSION, strict=True)  # raises on a missing schema too
        return
    with open(os.path.join(HERE, "schemas", "leaderworkerset-v1.json")) as f:
        jsonschema.validate(d, json.load(f))
    for what, tpl in pod_templates(d):
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{d['metadata']['name']}-{what}"},
                     "template": tpl}, KUBERNETES_VERSION, strict=True)


def test_every_document_validates_against_the_kubernetes_schemas(site):
    pytest.importorskip("kubernetes_validate", reason="requirements/dev.txt pins kubernetes-validate")
    import jsonschema
    import kubernetes_validate as kv

    _, docs = site
    for d in docs.values():
        validate(d)
    # negative controls: a misspelt field fails in each kind of workload, and in a LeaderWorkerSet's spec
    for d in workloads(docs):
        for what, _ in pod_templates(d):
            bad = copy.deepcopy(d)
            dict(pod_templates(bad))[what]["spec"]["containers"][0]["readinessProbes"] = {}
            with pytest.raises(kv.ValidationError):
                validate(bad)
        if d["kind"] == "LeaderWorkerSet":
            bad = copy.deepcopy(d)
            bad["spec"]["leaderWorkerTemplate"]["sizes"] = 2
            with pytest.raises(jsonschema.ValidationError):
                validate(bad)


def test_each_site_gets_its_roles_only(site):
    name, docs = site
    letter, names = SITES[name]
    for _, _, tpl in templates(docs):  # the label Prometheus' kubernetes-pods job and PodMonitor make `site` of
        assert tpl["metadata"]["labels"]["sglang-pdd/site"] == letter
    assert {d["metadata"]["name"] for d in workloads(docs)} == names
    assert all(d["metadata"]["namespace"] == "sglang-pdd" for d in docs.values())
    assert not any(k == "Secret" for k, _ in docs), "the secret is created out of band, never committed"


PLACEHOLDER_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]  # RFC 5737


def test_no_static_address_anywhere(site):
    """Services and DNS names only: no IP literal in any document but the NetworkPolicies' node CIDRs, which
    are documentation ranges (RFC 5737: placeholders, routable nowhere); every role advertises its node's
    address from the downward API (hostNetwork: the pod's address is its node's)."""
    _, docs = site
    text = yaml.safe_dump_all([d for (k, _), d in docs.items() if k != "NetworkPolicy"])
    ips = set(re.findall(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w.])", text))
    assert ips <= {"0.0.0.0"}, ips  # listening on every address is no address
    for _, cidr in policy_cidrs(docs):
        assert any(ipaddress.ip_network(cidr).subnet_of(n) for n in PLACEHOLDER_NETS), cidr
    for d, _, tpl in templates(docs):
        if d["metadata"]["labels"]["sglang-pdd/role"] == "router":
            continue
        (c,) = tpl["spec"]["containers"]
        host_ip = next(e for e in c["env"] if e["name"] == "SGLANG_HOST_IP")
        assert host_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        assert tpl["spec"]["hostNetwork"] is True and tpl["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"


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
    services = [d for (k, _), d in docs.items() if k == "Service"]
    for d, what, tpl in templates(docs):
        (c,) = tpl["spec"]["containers"]
        if what == "worker":  # an LWS worker runs TP ranks only: no HTTP server, nothing to probe or scrape
            assert not {"ports", "livenessProbe", "readinessProbe", "startupProbe"} & set(c)
            assert "annotations" not in tpl["metadata"]
            assert not any(s["spec"]["selector"].items() <= tpl["metadata"]["labels"].items() for s in services)
            continue
        http = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
        want = PROBES[d["metadata"]["labels"]["sglang-pdd/role"] == "router"]
        for probe, path in want.items():
            assert c[probe]["httpGet"] == {"path": path, "port": http}, (d["metadata"]["name"], probe)
        ann = tpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == str(http)
        assert ann["prometheus.io/path"] == "/metrics"
        (svc,) = [s for s in services if s["spec"]["selector"].items() <= tpl["metadata"]["labels"].items()]
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= {p["containerPort"] for p in c["ports"]}
        assert http in {p["targetPort"] for p in svc["spec"]["ports"]}
        if d["kind"] != "Deployment":  # a pool: a name per replica, kept while not ready (the router decides)
            assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
            if d["kind"] == "StatefulSet":
                assert d["spec"]["serviceName"] == svc["metadata"]["name"]


def lws_env(d: dict, index: int) -> dict:
    """What the LWS controller sets in every container of group 0's pod `index`."""
    name, ns = d["metadata"]["name"], d["metadata"]["namespace"]
    return {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.{ns}", "LWS_GROUP_SIZE": str(d["spec"]["leaderWorkerTemplate"]["size"]),
            "LWS_WORKER_INDEX": str(index)}


def resolved(container: dict, env: dict) -> tuple[list[str], dict]:
    """The container's argv and environment with Kubernetes' $(VAR) references expanded."""
    env = dict(env)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)
    return [_expand(a, env) for a in container["command"] + container["args"]], env


def _expand(s: str, env: dict) -> str:
    def sub(m):
        assert m.group(1) in env, f"$({m.group(1)}) is not defined"
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def role_argvs(docs: dict):
    """(workload, what, argv, env) of every pod template, LWS variables as group 0's pods get them."""
    settings = docs[("ConfigMap", "pdd-settings")]["data"]
    for d, what, tpl in templates(docs):
        (c,) = tpl["spec"]["containers"]
        assert [r["configMapRef"]["name"] for r in c["envFrom"]] == ["pdd-settings"]
        injected = lws_env(d, int(what == "worker")) if d["kind"] == "LeaderWorkerSet" else {}
        argv, env = resolved(c, {**settings, **injected})
        yield d, what, argv, env


def test_every_flag_exists_and_the_decode_roles_run_on_the_overlap_loop(site, server_parser, key_dir):
    from sglang_pdd.router.__main__ import build_parser

    name, docs = site
    settings = docs[("ConfigMap", "pdd-settings")]["data"]
    for d, what, argv, env in role_argvs(docs):
        role = d["metadata"]["labels"]["sglang-pdd/role"]
        if role == "router":
            build_parser().parse_args(argv[3:])  # which replicas it is given: test_the_router_knows_...
            continue
        # the keys the pod mounts, as keygen wrote them: the plugin's start-up checks read them
        ns, cfg = parse_server(server_parser, role, on_this_host(argv, key_dir), on_this_host(env, key_dir))
        if d["kind"] == "LeaderWorkerSet":  # TP 2 over the group's nodes, rank 0 on the leader
            size = d["spec"]["leaderWorkerTemplate"]["size"]
            assert ns.tp_size == 2 and ns.nnodes == size and ns.node_rank == (what == "worker"), role
            assert ns.dist_init_addr == f"{d['metadata']['name']}-0.{d['metadata']['name']}.sglang-pdd:20000"
            assert settings["PDD_PACKED_WAN"] == "off"  # the packed WAN path runs only at TP 1
        else:
            assert ns.tp_size == 1 and ns.nnodes == 1, role
        if role in ("relay", "main"):
            assert not ns.disable_overlap_schedule, role  # sglang's default loop
            assert ns.incremental_streaming_output, role  # O(n) stream bytes; MD's stream crosses the WAN
        assert supported.unsupported(cfg, ns) == [], role


def replica_names(docs: dict, role: str) -> list[str]:
    """The DNS names of a pool's replicas (StatefulSet pods, or LWS groups' leaders) both sites resolve:
    the pod's hostname under the zone ExternalDNS publishes for the headless Service that selects it."""
    (d,) = [d for d in workloads(docs) if d["metadata"]["labels"]["sglang-pdd/role"] == role]
    what = "leader" if d["kind"] == "LeaderWorkerSet" else "pod"
    labels = dict(pod_templates(d))[what]["metadata"]["labels"]
    (svc,) = [s for (k, _), s in docs.items() if k == "Service" and s["spec"]["selector"].items() <= labels.items()]
    zone = svc["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"]
    settings = docs[("ConfigMap", "pdd-settings")]["data"]
    site = labels["sglang-pdd/site"]
    assert zone == f"{d['metadata']['name']}.{settings[f'PDD_SITE_{site.upper()}_DOMAIN']}", zone
    return [f"{d['metadata']['name']}-{i}.{zone}" for i in range(d["spec"]["replicas"])]


def server_flags(docs: dict, role: str, server_parser):
    argv = next(a for d, what, a, _ in role_argvs(docs)
                if d["metadata"]["labels"]["sglang-pdd/role"] == role and what != "worker")
    return server_parser.parse_args(argv[3:])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_router_knows_every_replica_of_every_pool(variant, server_parser):
    """The router (site A) is given each P, RLD and MD replica of both sites by its cross-site DNS name, on
    the port each serves (P's bootstrap, RLD's token channel, MD's KV events included), and each MD trusts
    exactly the relays the router names."""
    from urllib.parse import urlparse

    from sglang_pdd.router.__main__ import _kv_event_args, _peer_args, build_parser

    a, b = (rendered(s) for s in VARIANTS[variant])
    (router,) = [(argv, d) for d, _, argv, _ in role_argvs(a) if d["metadata"]["name"] == "pdd-router"]
    args = build_parser().parse_args(router[0][3:])
    prefill = _peer_args(args.prefill, "prefill", 8998, "--prefill")
    relay = _peer_args(args.relay, "relay", None, "--relay")
    main = _peer_args(args.main, "main", None, "--main")
    events = _kv_event_args(args.main_kv_events, main, args.kv_events_topic)

    p, r, m = (server_flags(docs, role, server_parser) for docs, role in ((a, "prefill"), (a, "relay"), (b, "main")))
    assert [x.url for x in prefill] == [f"http://{n}:{p.port}" for n in replica_names(a, "prefill")]
    assert {x.bootstrap_port for x in prefill} == {p.disaggregation_bootstrap_port}
    assert [x.url for x in relay] == [f"http://{n}:{r.port}" for n in replica_names(a, "relay")]
    assert [x.token_channel for x in relay] == [f"tcp://{n}:{r.pdd_token_port}" for n in replica_names(a, "relay")]
    assert [x.url for x in main] == [f"http://{n}:{m.port}" for n in replica_names(b, "main")]
    kv = json.loads(m.kv_events_config)
    ports = [urlparse(kv[k].replace("*", "x")).port for k in ("endpoint", "replay_endpoint")]
    assert {u: (s.endpoint, s.replay_endpoint) for u, s in events.items()} == {
        f"http://{n}:{m.port}": tuple(f"tcp://{n}:{port}" for port in ports) for n in replica_names(b, "main")}
    assert config.PddConfig(relays=m.pdd_relays).relay_set == {x.token_channel for x in relay}
    assert len(prefill) > 1 and len(relay) > 1 and len(main) > 1  # pools, not single servers


MOUNT = "/etc/sglang-pdd"  # where every pod mounts its files of the Secret sglang-pdd-secret
# each role's files of keygen's (README, "Keys"), and the variable (or flag) that names each
KEY_FILES = {
    "prefill": {"secret": "SGLANG_PDD_SECRET_FILE", "role-api-key.yaml": "--config"},
    "relay": {"secret": "SGLANG_PDD_SECRET_FILE", "role-api-key.yaml": "--config",
              "relay.key": "SGLANG_PDD_TOKEN_CURVE_KEY_FILE", "curve-clients": "SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE"},
    "main": {"secret": "SGLANG_PDD_SECRET_FILE", "role-api-key.yaml": "--config",
             "relay.pub": "SGLANG_PDD_TOKEN_CURVE_KEY_FILE", "main.key": "SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE"},
    "router": {"secret": "SGLANG_PDD_SECRET_FILE", "role-api-key": "SGLANG_PDD_ROLE_API_KEY_FILE"},
}


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys") / "pdd-keys"
    keygen.write(str(d), ["main"])
    return d


def on_this_host(x, key_dir):
    """An argv or an environment with the Secret's mount path swapped for keygen's directory."""
    swap = lambda v: v.replace(MOUNT + "/", f"{key_dir}/")  # noqa: E731
    return {k: swap(v) for k, v in x.items()} if isinstance(x, dict) else [swap(v) for v in x]


def policy_cidrs(docs: dict) -> list[tuple[str, str]]:
    """(policy name, CIDR) of every ipBlock."""
    return [(d["metadata"]["name"], peer["ipBlock"]["cidr"]) for (k, _), d in docs.items() if k == "NetworkPolicy"
            for rule in d["spec"].get("ingress", []) for peer in rule.get("from", []) if "ipBlock" in peer]


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


def test_the_lite_renderer_expands_yaml_aliases_into_copies():
    # the LWS templates share their flags by YAML anchors; kustomize emits (and patches) two copies
    (lws,) = [d for d in render(os.path.join(K8S, "overlays", "site-b-lws")) if d["kind"] == "LeaderWorkerSet"]
    leader, worker = (t["spec"]["containers"][0] for _, t in pod_templates(lws))
    assert leader["args"] == worker["args"]
    apply_op(lws, {"op": "add", "path": "/spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0/args/-",
                   "value": "--leader-only"})
    assert leader["args"][-1] == "--leader-only" != worker["args"][-1]

