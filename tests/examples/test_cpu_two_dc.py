"""examples/cpu-two-dc: the script's dry run (PDD_DRY_RUN=1) starts P and RLD in namespace A and MD in
B with flags sglang 0.5.23 and the plugin accept, a router that points at them, and the CPU flags and
environment the testbed verified (sglang_pdd.lab.testing.launch_args). Nothing is started there.

`test_the_script_runs_end_to_end` (e2e) runs the script for real, as a user does, and checks what a user
looks for: it exits 0, the chat request's answer came P -> RLD -> MD with a handoff and is a single
server's answer, and nothing it started is left."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from sglang_pdd.lab.testing.launch_args import CPU_ENV, ServerConfig

from .conftest import EXAMPLES
from .server_argv import parse_server

SCRIPT = os.path.join(EXAMPLES, "cpu-two-dc", "run.sh")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """{"run": [argv...], "start": {name: (netns, env, argv)}, "keys": the key directory} of the dry run
    (which only prints its keygen: the keys are made here, so that the servers' flags can be checked
    against them)."""
    from sglang_pdd.protocol import keygen

    work = tmp_path_factory.mktemp("work")
    keygen.write(str(work / "keys"), ["main"])
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "PDD_DRY_RUN": "1", "PDD_WORK": str(work)})
    assert r.returncode == 0, r.stderr
    out = {"run": [], "start": {}, "keys": work / "keys"}
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
        _, env, argv = plan["start"][role]
        ns, cfg = parse_server(server_parser, role, argv, env)
        assert ns.device == "cpu" and ns.disaggregation_transfer_backend == "mooncake_tcp"
        if role != "prefill":
            assert ns.tp_size == 1 and ns.disable_overlap_schedule
            assert ns.incremental_streaming_output, role  # O(n) stream bytes, MD's across the WAN


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
    # MD accepts token channels only from the relays it names: the one the router hands it
    assert opt(md, "--pdd-relays") == f"tcp://{opt(rld, '--host')}:{opt(rld, '--pdd-token-port')}"
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
        assert env["SGLANG_PDD_SECRET_FILE"] == str(plan["keys"] / "secret"), role  # the router signs P's and MD's
        assert "SGLANG_PDD_SECRET" not in env
    keygen = [a for a in plan["run"] if a[1:3] == ["-m", "sglang_pdd.protocol.keygen"]]
    assert keygen == [[keygen[0][0], "-m", "sglang_pdd.protocol.keygen", str(plan["keys"]), "--force"]]


def test_the_roles_are_locked_and_the_token_channel_encrypted(plan, server_parser):
    """Every role runs sglang's --api-key (from --config) with the key the router holds; RLD and MD encrypt
    the token channel (it crosses the WAN) with keygen's CURVE keys, --pdd-token-curve on."""
    import zmq

    from sglang_pdd.protocol import keys
    from sglang_pdd.router.peers import role_auth

    from .server_argv import role_environment

    _, router_env, router = plan["start"]["router"]
    key = role_auth.load(router_env)
    assert key and "--insecure-roles" not in router
    for role in ("prefill", "relay", "main"):
        _, env, argv = plan["start"][role]
        assert parse_server(server_parser, role, argv, env)[0].api_key == key, role
    curve = {}
    for role in ("relay", "main"):
        _, env, argv = plan["start"][role]
        assert opt(argv, "--pdd-token-curve") == "on", role
        with role_environment(env):
            curve[role] = keys.curve_key("on"), (keys.curve_clients("on") if role == "relay" else
                                                 keys.curve_client_key("on"))
    assert zmq.curve_public(curve["relay"][0]) == curve["main"][0] and zmq.curve_public(curve["main"][1]) in curve["relay"][1]


def test_the_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


RESULT = re.compile(r"^PDD result: pipeline=(?P<pipeline>\S+) handoff=(?P<handoff>\S+) "
                    r"rld_tokens=(?P<rld>\d+) md_tokens=(?P<md>\d+) text=(?P<text>.*)$", re.M)


def _leftovers(work, names) -> tuple[set[str], list[int], bool]:
    """The script's namespaces still there, the PIDs of processes it started still running (every server
    and the router carry its secret file in their environment), and whether its WAN veth is still here."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    mark = f"SGLANG_PDD_SECRET_FILE={work}/keys/secret".encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            continue
    veth = subprocess.run(["ip", "link", "show", "pdd-wan-a"], capture_output=True).returncode == 0
    return set(names) & set(listed), pids, veth


@pytest.mark.e2e
def test_the_script_runs_end_to_end(plan, tmp_path, tiny_model, reference_server, figures):
    """The README's `sudo bash examples/cpu-two-dc/run.sh`, with the suite's tiny model, namespaces and a
    work dir of its own. The answer it prints is the single server's (seeded sampling), and another seed
    gives another answer (so the comparison decides); every server, the router and both namespaces are
    gone when it returns."""
    for tool in ("tc", "curl"):  # root and `ip`: the private namespace the reference server runs in
        if shutil.which(tool) is None:
            pytest.skip(f"examples/cpu-two-dc/run.sh needs {tool}")
    names = (f"pdd-ex{os.getpid()}a", f"pdd-ex{os.getpid()}b")
    work = tmp_path / "work"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "PDD_PYTHON": sys.executable,
           "PDD_MODEL": tiny_model, "PDD_WORK": str(work), "PDD_NS_A": names[0], "PDD_NS_B": names[1]}
    proc = subprocess.Popen(["bash", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.terminate()  # its trap stops the servers and deletes the namespaces
            out, _ = proc.communicate(timeout=60)
            pytest.fail(f"run.sh did not finish in 600 s:\n{out[-4000:]}")
        left = _leftovers(work, names)
    finally:  # whatever happened, leave nothing behind for the rest of the session
        _, pids, _ = _leftovers(work, names)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    logs = "".join(f"\n== {p.name}\n" + p.read_text()[-1500:] for p in sorted(work.glob("*.log")))
    assert proc.returncode == 0, f"run.sh exited {proc.returncode}:\n{out[-4000:]}{logs}"
    assert left == (set(), [], False), f"left behind (namespaces, PIDs, veth): {left}"

    body = json.loads(next(a for a in plan["run"] if "/v1/chat/completions" in " ".join(a))[-1])
    answer = json.loads(next(line for line in out.splitlines() if line.startswith('{"id"')))
    text = answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] == body["max_tokens"] and text
    m = RESULT.search(out)
    assert m, f"no result line:\n{out}"
    assert m["pipeline"] == "P->RLD->MD" and m["handoff"] in ("one-shot", "catch-up"), m[0]
    k, n_md = int(m["rld"]), int(m["md"])
    assert k >= 1 and n_md >= 1 and k + n_md == body["max_tokens"], m[0]  # RLD decoded k, MD the rest
    assert json.loads(m["text"]) == text
    assert re.search(r"^WAN: (netem|tbf), ", out, re.M), out
    for name in ("secret", "role-api-key", "role-api-key.yaml", "relay.key", "main.key"):  # the owner's only
        assert (work / "keys" / name).stat().st_mode & 0o077 == 0, name

    from sglang_pdd.lab.testing.servers import http_json

    status, ref = http_json(reference_server.url + "/v1/chat/completions", body)
    assert status == 200 and ref["usage"]["prompt_tokens"] == answer["usage"]["prompt_tokens"], ref
    assert text == ref["choices"][0]["message"]["content"]  # seeded: the single server's tokens, via P->RLD->MD
    status, other = http_json(reference_server.url + "/v1/chat/completions", {**body, "seed": body["seed"] + 1})
    assert status == 200 and other["choices"][0]["message"]["content"] != text  # the seed decides the tokens
    figures.append(f"examples/cpu-two-dc/run.sh: {m['pipeline']}, {m['handoff']} handoff after {k} of "
                   f"{body['max_tokens']} tokens, the single server's answer; nothing left behind")
