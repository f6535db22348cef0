"""examples/kubernetes locked by default (issue 47 item 4): every key is a file of the Secret, each pod
mounting exactly the files it reads; every role runs sglang's --api-key through --config with the key the
router holds, RLD and MD encrypt the token channel (--pdd-token-curve=on), each role's flags pass the
plugin's start-up checks against files `protocol.keygen` wrote, and the README's `kubectl create secret`
commands create what the pods mount; every container requests cpu and memory (GPU roles Guaranteed, the
router Burstable); a NetworkPolicy admits every port each workload serves. The rendering, schemas, probes
and flags are test_kubernetes.py's."""

from __future__ import annotations

import copy
import os
import re

import pytest

from sglang_pdd.protocol import keygen

from .server_argv import parse_server
from .test_kubernetes import (K8S, KEY_FILES, MOUNT, SITES, VARIANTS, key_dir, on_this_host,  # noqa: F401 (fixtures)
                              policy_cidrs, rendered, role_argvs, site, templates)


def mounted_keys(tpl: dict) -> dict[str, str]:
    """{file in the Secret: its path in the container} of a pod template (one Secret volume, one mount)."""
    spec = tpl["spec"]
    (c,) = spec["containers"]
    (vol,) = [v for v in spec["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "sglang-pdd-secret" and vol["secret"]["defaultMode"] == 0o400
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount["readOnly"] and mount["mountPath"] == MOUNT
    return {i["key"]: os.path.join(MOUNT, i["path"]) for i in vol["secret"]["items"]}


def test_every_key_is_a_file_of_the_secret_each_pod_mounting_its_own(site):
    """Every role and the router read each key from a file of the Secret, named by a variable (or sglang's
    --config), and mount exactly the files they read; no key value in any argument or environment value."""
    _, docs = site
    for d, _, tpl in templates(docs):
        role = d["metadata"]["labels"]["sglang-pdd/role"]
        files = mounted_keys(tpl)
        assert set(files) == set(KEY_FILES[role]) and set(files) <= set(keygen.files(["main"])), role
        (c,) = tpl["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        args = c["args"]
        for name, where in KEY_FILES[role].items():
            if where == "--config":  # a lone --config then the path: sglang merges a file only after that word
                assert args[args.index("--config") + 1] == files[name], role
            else:
                assert env[where] == files[name], (role, where)
        assert not {"SGLANG_PDD_SECRET", "SGLANG_PDD_ROLE_API_KEY", "SGLANG_PDD_TOKEN_CURVE_KEY"} & set(env)
        assert not any(a.startswith(("--api-key", "--role-api-key", "--config=")) for a in args), role
        assert ("--pdd-token-curve=on" in args) == (role in ("relay", "main")), role


def test_the_roles_are_locked_with_the_key_the_router_holds_and_the_channel_encrypted(server_parser, key_dir):
    """With keygen's files where the pods mount the Secret: every role's sglang --api-key (merged from
    --config as sglang merges it) is the router's role key, and RLD's CURVE key pair and allowlist match
    MD's keys (each of those flags passes the plugin's start-up checks: test_every_flag_exists_...)."""
    import zmq

    from sglang_pdd.protocol import keys
    from sglang_pdd.router.peers import role_auth

    from .server_argv import role_environment

    for variant in VARIANTS.values():
        a, b = (rendered(s) for s in variant)
        (router_env,) = [env for d, _, _, env in role_argvs(a) if d["metadata"]["name"] == "pdd-router"]
        key = role_auth.load(on_this_host(router_env, key_dir))
        assert key == (key_dir / "role-api-key").read_text().strip()
        curve = {}
        for d, what, argv, env in list(role_argvs(a)) + list(role_argvs(b)):
            role = d["metadata"]["labels"]["sglang-pdd/role"]
            if role == "router":
                continue
            ns, _ = parse_server(server_parser, role, on_this_host(argv, key_dir), on_this_host(env, key_dir))
            assert ns.api_key == key, (role, what)
            if role in ("relay", "main"):
                with role_environment(on_this_host(env, key_dir)):
                    curve[role] = keys.curve_key("on"), (keys.curve_clients("on") if role == "relay"
                                                         else keys.curve_client_key("on"))
        (rk, admitted), (rpub, mk) = curve["relay"], curve["main"]
        assert zmq.curve_public(rk) == rpub and zmq.curve_public(mk) in admitted


def test_the_readmes_secrets_hold_what_each_site_mounts():
    """The `kubectl create secret` command of each site creates exactly the files its pods mount: relay.key
    never enters site B, main.key never site A."""
    with open(os.path.join(K8S, "README.md")) as f:
        readme = f.read()
    made = {}
    for ctx, cmd in re.findall(r"kubectl --context (site-[ab]) -n sglang-pdd create secret generic sglang-pdd-secret"
                               r"((?:\\\n|[^\n])*)", readme):
        made[ctx] = {os.path.basename(p) for p in re.findall(r"--from-file=(\S+)", cmd)}
    for site, (letter, _) in SITES.items():
        mounted = set().union(*(mounted_keys(tpl) for _, _, tpl in templates(rendered(site))))
        assert made[f"site-{letter}"] == mounted, site
    assert "relay.key" not in made["site-b"] and "main.key" not in made["site-a"]


# -- resources ---------------------------------------------------------------------------------------------
def qos(c: dict) -> str:
    """Kubernetes' QoS class of a one-container pod."""
    req, lim = c.get("resources", {}).get("requests", {}), c.get("resources", {}).get("limits", {})
    if all(k in lim for k in ("cpu", "memory")) and all(req.get(k, lim[k]) == lim[k] for k in lim):
        return "Guaranteed"
    return "Burstable" if req or lim else "BestEffort"


def test_every_container_requests_cpu_and_memory_gpu_roles_guaranteed(site):
    _, docs = site
    for d, what, tpl in templates(docs):
        (c,) = tpl["spec"]["containers"]
        name, res = d["metadata"]["name"], c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]), (name, what)
        if d["metadata"]["labels"]["sglang-pdd/role"] == "router":
            assert qos(c) == "Burstable" and "cpu" not in res.get("limits", {}) and "memory" in res["limits"]
        else:  # the GPU roles: requests = limits, the GPU included
            assert qos(c) == "Guaranteed" and res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
    # the classification can fail: a GPU limit alone was BestEffort in cpu and memory
    assert qos({"resources": {"limits": {"nvidia.com/gpu": 1}}}) == "Burstable"
    assert qos({}) == "BestEffort" and qos({"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}) == "Guaranteed"


# -- network policies --------------------------------------------------------------------------------------
def admitted(policy: dict, port: int) -> list[list[dict]]:
    """The `from` lists of the ingress rules that admit TCP `port` ([] for a rule from anywhere)."""
    out = []
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports is None or any(p.get("protocol", "TCP") == "TCP" and p.get("port") in (None, port) for p in ports):
            out.append(rule.get("from", []))
    return out


def check_policies(docs: dict) -> None:
    """Each workload's pods are selected by one NetworkPolicy that admits every port they serve, the HTTP
    port from the router (P, RLD: its pods; MD: site A's nodes), RLD's token port from site B's nodes."""
    policies = [d for (k, _), d in docs.items() if k == "NetworkPolicy"]
    cidrs = {name: cidr for name, cidr in policy_cidrs(docs)}
    site_a, site_b = "192.0.2.0/24", "198.51.100.0/24"
    for d, what, tpl in templates(docs):
        labels = tpl["metadata"]["labels"]
        mine = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert len(mine) == 1, (d["metadata"]["name"], what)
        (p,) = mine
        assert p["spec"]["policyTypes"] == ["Ingress"]
        (c,) = tpl["spec"]["containers"]
        for port in c.get("ports", []):
            assert admitted(p, port["containerPort"]), (d["metadata"]["name"], port)
        role = labels["sglang-pdd/role"]
        http = next((x["containerPort"] for x in c.get("ports", []) if x["name"] == "http"), None)
        if http is None:  # an LWS worker: no HTTP server, no token channel
            continue
        if role in ("prefill", "relay"):
            assert any(peer.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "pdd-router"}
                       for peers in admitted(p, http) for peer in peers), role
        if role == "main":
            assert any(peer.get("ipBlock", {}).get("cidr") == site_a for peers in admitted(p, http) for peer in peers)
        if role == "relay":
            assert any(peer.get("ipBlock", {}).get("cidr") == site_b for peers in admitted(p, 18500) for peer in peers)
            assert not any(peer.get("ipBlock", {}).get("cidr") == site_b for peers in admitted(p, 15000)
                           for peer in peers), "MD reaches RLD's token channel only"
    assert set(cidrs.values()) <= {site_a, site_b}, cidrs


def test_a_network_policy_admits_each_port_of_each_workload(site):
    _, docs = site
    check_policies(docs)
    # the check can fail: each policy in turn replaced by one that admits its pods' ports from nobody
    for (k, name), d in docs.items():
        if k == "NetworkPolicy" and name != "pdd-router":
            bad = copy.deepcopy(docs)  # a policy that admits one port from nobody of ours
            bad[(k, name)]["spec"]["ingress"] = [{"from": [{"podSelector": {"matchLabels": {"x": "y"}}}],
                                                  "ports": [{"protocol": "TCP", "port": 1}]}]
            with pytest.raises(AssertionError):
                check_policies(bad)
