"""A role started with sglang settings it is not proven with exits at start-up, naming the flag and
what to do; what the repository's own launchers pass is accepted. Flags parsed by sglang's parser."""

import argparse
from types import SimpleNamespace

import pytest

from sglang_pdd import config
from sglang_pdd.protocol import keys
from sglang_pdd.server import supported
from sglang_pdd.hooks import server_args as server_args_hook
from sglang_pdd.lab.testing.launch_args import ServerConfig

pytest.importorskip("sglang")

DECODE = ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake",
          "--disaggregation-decode-enable-radix-cache"]
ROLE_ARGS = {"relay": ["--pdd-role", "relay", "--pdd-token-port", "18500", *DECODE],
             "main": ["--pdd-role", "main", *DECODE]}


@pytest.fixture(scope="module")
def parser():
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(p)
    config.add_cli_args(p)
    return p


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv(keys.ENV_SECRET, "sixteen-byte-key")
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)


def start(parser, *argv) -> str:
    """What the server-args hook says about this command line ('' when it starts)."""
    ns = parser.parse_args(["--model-path", "m", *argv])
    try:
        # no sglang launcher here: the plugin's check that the hooks were applied is a no-op
        server_args_hook.after_from_cli_args(argparse.Namespace(), None, ns, require_hooks_applied=lambda: None)
    except SystemExit as e:
        return str(e)
    finally:
        config.PddConfig().export_env()
    return ""


@pytest.mark.parametrize("role", ["relay", "main"])
@pytest.mark.parametrize("extra, flag, advice", [
    (["--pp-size", "2"], "--pp-size 1, got --pp-size 2", "with --pp-size 1"),
    (["--dp-size", "2"], "--dp-size 1, got --dp-size 2", "with --dp-size 1"),
    (["--attn-dp-size", "2"], "--attn-dp-size 1", "with --attn-dp-size 1"),
    (["--enable-dp-attention"], "DP attention", "drop --enable-dp-attention"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm EAGLE", "drop --speculative-algorithm"),
    (["--disaggregation-transfer-backend", "nixl"],
     "--disaggregation-transfer-backend nixl", "use --disaggregation-transfer-backend mooncake"),
])
def test_a_decode_role_with_an_unproven_setting_exits_naming_the_flag(parser, role, extra, flag, advice):
    said = start(parser, *ROLE_ARGS[role], *extra)
    assert said.startswith("sglang-pdd: error: ") and f"--pdd-role {role}" in said
    assert flag in said and advice in said


@pytest.mark.parametrize("role", ["relay", "main"])
@pytest.mark.parametrize("overlap", [[], ["--disable-overlap-schedule"]], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("tp", ["1", "2"])
def test_a_decode_role_on_mooncake_starts_with_either_scheduler_loop_at_tp_1_or_2(parser, role, overlap, tp):
    assert start(parser, *ROLE_ARGS[role], *overlap, "--tp-size", tp) == ""


@pytest.mark.parametrize("role, extra", [
    ("prefill", ["--pdd-role", "prefill", "--disaggregation-mode", "prefill"]),
    ("main", ROLE_ARGS["main"]),
])
def test_the_packed_wan_path_at_tp2_is_refused_naming_both_flags(parser, role, extra):
    said = start(parser, *extra, "--pdd-packed-wan", "plain", "--tp-size", "2")
    assert said.startswith("sglang-pdd: error: ") and "--pdd-packed-wan plain" in said and "--tp-size 2" in said
    assert start(parser, *extra, "--pdd-packed-wan", "plain", "--tp-size", "1") == ""


def test_prefill_may_run_tp2_with_the_overlap_scheduler_but_only_on_mooncake(parser):
    p = ["--pdd-role", "prefill", "--disaggregation-mode", "prefill", "--tp-size", "2"]
    assert start(parser, *p) == ""
    assert "--disaggregation-transfer-backend nixl" in start(parser, *p, "--disaggregation-transfer-backend", "nixl")


def test_a_plain_server_is_not_checked(parser):
    assert start(parser, "--tp-size", "2", "--disaggregation-transfer-backend", "nixl") == ""


def test_every_problem_is_named_at_once(parser):
    said = start(parser, *ROLE_ARGS["main"], "--pp-size", "2", "--enable-dp-attention")
    assert said.count("sglang-pdd: error: ") == 2


@pytest.mark.parametrize("mode, extra", [
    ("prefill", ["--pdd-role", "prefill"]),
    ("decode", ["--pdd-role", "relay", "--pdd-token-port", "18500"]),
    ("decode", ["--pdd-role", "main", "--pdd-relays", "tcp://127.0.0.1:18500"]),
])
def test_the_test_and_benchmark_launchers_pass_what_the_roles_need(parser, mode, extra):
    argv = ServerConfig(model="m", port=1, mode=mode, decode_radix_cache=mode == "decode", extra=extra).argv()
    ns = parser.parse_args(argv[3:])
    cfg = config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)
    assert cfg.active and supported.unsupported(cfg, ns) == []


def _pool(cls):
    return object.__new__(cls)  # the class is what counts; sglang's pools need a device to build


@pytest.mark.parametrize("role", ["prefill", "relay", "main"])
@pytest.mark.parametrize("cls_name, match", [
    ("DSATokenToKVPool", "does not run on sparse indexed attention .DSA/NSA"),
    ("HybridLinearKVPool", "runs only on sglang's MHA and MLA KV pools .*sliding-window and hybrid linear"),
    ("SWAKVPool", "runs only on sglang's MHA and MLA KV pools .*sliding-window and hybrid linear"),
])
def test_a_pdd_role_on_a_kv_pool_it_is_not_proven_on_stops_the_scheduler_naming_the_pool(role, cls_name, match):
    from sglang.srt.mem_cache import memory_pool, swa_memory_pool

    from sglang_pdd.hooks.packed_wan import after_init_kv_manager
    from sglang_pdd.server.roles import Role

    cls = getattr(memory_pool, cls_name, None) or getattr(swa_memory_pool, cls_name)
    cfg = config.PddConfig(role=Role(role))
    with pytest.raises(RuntimeError, match=f"sglang-pdd: error: --pdd-role {role} {match}.*without --pdd-role"):
        supported.require_kv_pool(cfg, _pool(cls))
    with pytest.raises(RuntimeError, match=f"this model's KV pool is {cls_name} "):
        supported.require_kv_pool(cfg, _pool(cls))
    cfg.export_env()
    try:  # the hook sglang runs at the KV manager's start does the same
        with pytest.raises(RuntimeError, match=cls_name):
            after_init_kv_manager("manager", SimpleNamespace(token_to_kv_pool=_pool(cls)))
    finally:
        config.PddConfig().export_env()


@pytest.mark.parametrize("cls_name", ["MHATokenToKVPool", "MHATokenToKVPoolFP4", "MLATokenToKVPool",
                                      "MLATokenToKVPoolFP4"])
@pytest.mark.parametrize("role", ["prefill", "relay", "main"])
def test_mha_and_mla_pools_and_servers_without_a_role_pass(cls_name, role):
    from sglang.srt.mem_cache import memory_pool

    from sglang_pdd.server.roles import Role

    pool = _pool(getattr(memory_pool, cls_name))
    assert supported.unsupported_kv_pool(config.PddConfig(role=Role(role)), pool) is None
    assert supported.unsupported_kv_pool(config.PddConfig(), _pool(memory_pool.DSATokenToKVPool)) is None


@pytest.mark.parametrize("role", ["prefill", "main"])
def test_the_packed_wan_path_runs_on_mla_pools_and_still_refuses_dsa(role):
    from sglang.srt.mem_cache import memory_pool

    from sglang_pdd.server.roles import Role

    cfg = config.PddConfig(role=Role(role), packed_wan="plain")
    assert supported.unsupported_kv_pool(cfg, _pool(memory_pool.MLATokenToKVPool)) is None
    assert "DSA/NSA" in supported.unsupported_kv_pool(cfg, _pool(memory_pool.DSATokenToKVPool))


def test_a_prefill_that_relays_refuses_an_mla_pool_until_it_is_proven_there():
    from sglang.srt.mem_cache import memory_pool

    from sglang_pdd.server.roles import Role

    cfg = config.PddConfig(role=Role.PREFILL, relay="local", token_port=18592)
    assert "--pdd-relay local" in supported.unsupported_kv_pool(cfg, _pool(memory_pool.MLATokenToKVPool))
    assert supported.unsupported_kv_pool(cfg, _pool(memory_pool.MHATokenToKVPool)) is None


RELAYING_P = ["--pdd-role", "prefill", "--disaggregation-mode", "prefill", "--pdd-relay", "local",
              "--pdd-token-port", "18592"]


@pytest.mark.parametrize("extra, names", [
    ([], "--disable-overlap-schedule"),
    (["--disable-overlap-schedule", "--tp-size", "2"], "--tp-size 2"),
    (["--disable-overlap-schedule", "--optimistic-prefill-attempts", "2"], "--optimistic-prefill-attempts"),
    (["--disable-overlap-schedule", "--speculative-algorithm", "EAGLE"], "--speculative-algorithm"),
])
def test_a_prefill_that_relays_with_an_unproven_setting_exits_naming_the_flag(parser, extra, names):
    said = start(parser, *RELAYING_P, *extra)
    assert said.startswith("sglang-pdd: error: ") and "--pdd-relay local" in said and names in said
    assert start(parser, *RELAYING_P, "--disable-overlap-schedule") == ""
