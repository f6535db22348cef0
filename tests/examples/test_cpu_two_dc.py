"""examples/cpu-two-dc: the script's dry run (PDD_DRY_RUN=1) starts P and RLD in namespace A and MD in
B with flags sglang 0.5.23 and the plugin accept, a router that points at them, and the CPU flags and
environment the testbed verified (sglang_pdd.testing.launch_args). Nothing is started."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from sglang_pdd.testing.launch_args import CPU_ENV, ServerConfig

from .conftest import EXAMPLES
from .server_argv import parse_server

SCRIPT = os.path.join(EXAMPLES, "cpu-two-dc", "run.sh")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """{"run": [argv...], "start": {name: (netns, env, argv)}} of the dry run."""
    work = tmp_path_factory.mktemp("work")
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "PDD_DRY_RUN": "1", "PDD_WORK": str(work)})
    assert r.returncode == 0, r.stderr
    out = {"run": [], "start": {}}
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        kind, _, rest = line.partition(" ")
        argv = shlex.split(rest)
        if kind == "run":
            out["run"].append(argv)
            continue
        assert kind == "start", line
        name, argv = argv[0], argv[1:]
        assert argv[:3] == ["ip", "netns", "exec"], argv
        ns, argv = argv[3], argv[4:]
        env = {}
        if argv[0] == "env":
            argv = argv[1:]
            while "=" in argv[0]:
                k, _, v = argv.pop(0).partition("=")
                env[k] = v
        out["start"][name] = (ns, env, argv)
    return out


def opt(argv, flag, n=1):
    i = argv.index(flag)
    return argv[i + 1] if n == 1 else argv[i + 1:i + 1 + n]


def test_servers_parse_and_take_their_roles(plan, server_parser):
    for role in ("prefill", "relay", "main"):
        _, _, argv = plan["start"][role]
        ns, cfg = parse_server(server_parser, role, argv)
        assert ns.device == "cpu" and ns.disaggregation_transfer_backend == "mooncake_tcp"
        if role != "prefill":
            assert ns.tp_size == 1 and ns.disable_overlap_schedule


def test_cpu_flags_and_environment_are_the_verified_ones(plan):
    verified = ServerConfig(model="M", port=1, mode="decode").argv()[3:]
    flags = {a for a in verified if a.startswith("--")} - {"--model-path", "--tokenizer-path", "--host", "--port",
                                                             "--disaggregation-mode"}
    for role in ("prefill", "relay", "main"):
        _, env, argv = plan["start"][role]
        assert flags - {"--disaggregation-decode-retraction-backup"} <= set(argv), role
        assert {k: env[k] for k in CPU_ENV} == CPU_ENV and env["SGLANG_HOST_IP"] == opt(argv, "--host")


def test_the_sites_and_the_router(plan):
    from sglang_pdd.router.__main__ import build_parser

    (ns_p, _, p), (ns_r, _, rld), (ns_m, _, md) = (plan["start"][r] for r in ("prefill", "relay", "main"))
    ns_router, _, router = plan["start"]["router"]
    assert ns_p == ns_r == ns_router != ns_m
    assert router[1:3] == ["-m", "sglang_pdd.router"]
    args = build_parser().parse_args(router[3:])
    url = lambda a: f"http://{opt(a, '--host')}:{opt(a, '--port')}"  # noqa: E731
    assert args.prefill == [[url(p), opt(p, "--disaggregation-bootstrap-port")]]
    assert args.relay == [[url(rld), opt(rld, "--pdd-token-port")]]
    assert args.main == [[url(md)]]
    ev = json.loads(opt(md, "--kv-events-config"))
    assert args.main_kv_events == [[f"tcp://{opt(md, '--host')}:{ev[k].rsplit(':', 1)[1]}"
                                     for k in ("endpoint", "replay_endpoint")]]
    assert opt(p, "--host") != opt(md, "--host")
    # the namespaces the servers run in are made, and the WAN between them is shaped as the router assumes
    made = [a[3] for a in plan["run"] if a[:3] == ["ip", "netns", "add"]]
    assert sorted(made) == sorted({ns_p, ns_m})
    netem = [a for a in plan["run"] if "netem" in a]
    assert len(netem) == 2 and all(opt(a, "rate") == f"{int(args.wan_mbit)}mbit" for a in netem)
    assert sum(float(opt(a, "delay").removesuffix("ms")) for a in netem) == args.wan_rtt_ms
    # and the one request goes to the router
    (req,) = [a for a in plan["run"] if "/v1/chat/completions" in " ".join(a)]
    assert req[-1].startswith("{") and json.loads(req[-1])["model"] == args.model_name
    assert f"http://{args.host}:{args.port}/v1/chat/completions" in req


def test_the_secret_is_a_file_for_every_role_and_the_router(plan):
    assert set(plan["start"]) >= {"prefill", "relay", "main", "router"}
    for role, (_, env, argv) in plan["start"].items():
        assert "SGLANG_PDD_SECRET_FILE" in env, role  # the router signs P's and MD's PDD parameters
        assert "SGLANG_PDD_SECRET" not in env


def test_the_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
