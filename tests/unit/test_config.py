import argparse
import json
from dataclasses import fields

import pytest

from sglang_pdd import config
from sglang_pdd.config import PddConfig, PddConfigError
from sglang_pdd.server.roles import Role


def parse(*argv):
    p = argparse.ArgumentParser()
    config.add_cli_args(p)
    return p.parse_args(list(argv))


def test_no_role_means_inactive_plain_sglang():
    cfg = config.from_cli_args(parse())
    assert cfg == PddConfig() and not cfg.active


def test_role_typo_is_rejected_by_the_parser_naming_flag_and_choices(capsys):
    with pytest.raises(SystemExit):
        parse("--pdd-role", "relai")
    err = capsys.readouterr().err
    assert "--pdd-role" in err and "'prefill', 'relay', 'main'" in err


@pytest.mark.parametrize("role, mode", [("prefill", "prefill"), ("relay", "decode"), ("main", "decode")])
def test_each_role_runs_on_its_disaggregation_mode(role, mode):
    argv = ["--pdd-role", role, "--pdd-token-port", "18500"]
    cfg = config.from_cli_args(parse(*argv), disaggregation_mode=mode, decode_radix_cache=True)
    assert cfg.role is Role(role)
    other = "decode" if mode == "prefill" else "prefill"
    with pytest.raises(PddConfigError, match=f"--pdd-role {role} runs on --disaggregation-mode {mode}"):
        config.from_cli_args(parse(*argv), disaggregation_mode=other, decode_radix_cache=True)


def test_relay_needs_a_token_port():
    with pytest.raises(PddConfigError, match="--pdd-role relay needs --pdd-token-port"):
        config.from_cli_args(parse("--pdd-role", "relay"), disaggregation_mode="decode")


@pytest.mark.parametrize("argv, match", [
    (["--pdd-token-port", "70000"], "not a TCP port"),
    (["--pdd-handoff-timeout", "0"], "must be > 0"),
    (["--pdd-main-bootstrap-timeout", "-1"], "must be > 0"),
    (["--pdd-catchup-chunk", "0"], "--pdd-catchup-chunk"),
    (["--pdd-catchup-chunk", "8", "--pdd-catchup-gap", "9"], "--pdd-catchup-gap"),
])
def test_bad_numeric_flags_name_themselves(argv, match):
    with pytest.raises(PddConfigError, match=match):
        config.from_cli_args(parse(*argv))


def test_relays_name_the_token_channels_main_trusts():
    cfg = config.from_cli_args(parse("--pdd-relays", "tcp://10.0.0.5:18500, tcp://rld-b:18501"))
    assert cfg.relay_set == {"tcp://10.0.0.5:18500", "tcp://rld-b:18501"}
    assert PddConfig().relay_set == frozenset()


@pytest.mark.parametrize("value", ["10.0.0.5:18500", "tcp://10.0.0.5", "tcp://:18500", "tcp://h:0", "tcp://h:x"])
def test_a_relay_that_is_not_tcp_host_port_is_refused_at_start_up(value):
    with pytest.raises(PddConfigError, match="--pdd-relays: .* is not tcp://host:port"):
        config.from_cli_args(parse("--pdd-relays", f"tcp://ok:1,{value}"))


def test_main_requires_the_decode_radix_cache():
    with pytest.raises(PddConfigError, match="--disaggregation-decode-enable-radix-cache"):
        config.from_cli_args(parse("--pdd-role", "main"), disaggregation_mode="decode", decode_radix_cache=False)


def test_config_round_trips_through_the_environment():
    env = {}
    cfg = PddConfig(role=Role.RELAY, token_port=18500, handoff_timeout=5.0)
    cfg.export_env(env)
    assert PddConfig.from_env(env) == cfg
    PddConfig().export_env(env)
    assert config.ENV_CONFIG not in env and not PddConfig.from_env(env).active


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"role": "relay", "colour": 1}', "unknown keys"),
    ('{"role": "relai"}', "invalid choice"),
])
def test_malformed_exported_config_is_a_clear_error(text, match):
    with pytest.raises(PddConfigError, match=match):
        PddConfig.from_env({config.ENV_CONFIG: text})


# A non-default, valid value of every flag (a new flag needs one here: the test below checks they match).
NON_DEFAULT = {
    "role": "prefill",
    "token_port": 18500,
    "main_bootstrap_timeout": 12.5,
    "relay_finished_kv": "abort",
    "handoff_mode": "catch-up",
    "catchup_chunk": 16,
    "catchup_gap": 3,
    "handoff_attention": "sglang",
    "packed_wan": "fp8",
    "packed_wan_mb": 64,
    "packed_staging_bytes": 4096,
    "adaptive_md_batch": 0,
    "adaptive_rld_running": 5,
    "adaptive_rld_kv": 0.25,
    "handoff_timeout": 7.5,
    "seeded_sampling": "on",
    "token_curve": "off",
    "relays": "tcp://10.0.0.5:18500,tcp://rld-b:18501",
    "relay": "local",
    "kv_timeout": 90.0,
    "idle_wait_ms": 2.5,
    "transfer_poll_ms": 0.5,
}


def _value(cfg, name):
    value = getattr(cfg, name)
    return value.value if isinstance(value, Role) else value


def test_every_flag_is_a_config_field_with_the_same_default():
    assert {s.name for s in config.FLAGS} == {f.name for f in fields(PddConfig)} == set(NON_DEFAULT)
    for spec in config.FLAGS:
        assert getattr(PddConfig(), spec.name) == spec.default, spec.name
        assert NON_DEFAULT[spec.name] != spec.default, spec.name


def test_every_flag_survives_the_cli_and_the_json_round_trip_together():
    argv = [a for s in config.FLAGS for a in (s.flag, str(NON_DEFAULT[s.name]))]
    cfg = config.from_cli_args(parse(*argv), disaggregation_mode="prefill")
    for spec in config.FLAGS:
        assert _value(cfg, spec.name) == NON_DEFAULT[spec.name], spec.flag
    assert PddConfig.from_json(cfg.to_json()) == cfg
    env = {}
    cfg.export_env(env)
    assert PddConfig.from_env(env) == cfg


@pytest.mark.parametrize("spec", config.FLAGS, ids=lambda s: s.name)
def test_each_flag_alone_survives_the_cli_and_the_json_round_trip(spec):
    mode = "prefill" if spec.name == "role" else "null"
    cfg = config.from_cli_args(parse(spec.flag, str(NON_DEFAULT[spec.name])), disaggregation_mode=mode)
    assert _value(cfg, spec.name) == NON_DEFAULT[spec.name]
    assert cfg == PddConfig(**{spec.name: getattr(cfg, spec.name)})  # nothing else changed
    back = PddConfig.from_json(cfg.to_json())
    assert back == cfg and _value(back, spec.name) == NON_DEFAULT[spec.name]


def test_packed_wan_defaults_off_and_parses_its_modes():
    assert PddConfig().packed_wan == "off" and PddConfig().packed_wan_mb == 512
    for mode in ("off", "plain", "fp8"):
        assert config.from_cli_args(parse("--pdd-packed-wan", mode)).packed_wan == mode


def test_a_packed_wan_typo_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--pdd-packed-wan", "fp16")
    assert "--pdd-packed-wan" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--pdd-packed-wan-mb", "0"], "--pdd-packed-wan-mb"),
    (["--pdd-packed-wan-mb", "-512"], "--pdd-packed-wan-mb"),
    (["--pdd-packed-wan-mb", str((1 << 20) + 1)], "--pdd-packed-wan-mb"),
    (["--pdd-packed-staging-bytes", "0"], "--pdd-packed-staging-bytes"),
    (["--pdd-adaptive-md-batch", "-1"], "--pdd-adaptive-md-batch"),
    (["--pdd-adaptive-rld-running", "-1"], "--pdd-adaptive-rld-running"),
    (["--pdd-adaptive-rld-kv", "1.5"], "--pdd-adaptive-rld-kv"),
    (["--pdd-adaptive-rld-kv", "-0.1"], "--pdd-adaptive-rld-kv"),
])
def test_bad_packed_and_adaptive_flags_name_themselves(argv, match):
    with pytest.raises(PddConfigError, match=match):
        config.from_cli_args(parse(*argv))


@pytest.mark.parametrize("d, match", [
    ({"packed_wan": "fp16"}, "--pdd-packed-wan: invalid choice"),
    ({"packed_wan_mb": 0}, "--pdd-packed-wan-mb"),
    ({"adaptive_md_batch": -3}, "--pdd-adaptive-md-batch"),
    ({"adaptive_rld_running": -1}, "--pdd-adaptive-rld-running"),
    ({"adaptive_rld_kv": 2.0}, "--pdd-adaptive-rld-kv"),
])
def test_bad_packed_and_adaptive_values_in_the_exported_config_are_rejected(d, match):
    with pytest.raises(PddConfigError, match=match):
        PddConfig.from_json(json.dumps({"role": "main", **d}))


def test_packed_wan_limits_are_inclusive():
    assert config.from_cli_args(parse("--pdd-packed-wan-mb", "1")).packed_wan_mb == 1
    assert config.from_cli_args(parse("--pdd-packed-wan-mb", str(1 << 20))).packed_wan_mb == 1 << 20
    cfg = config.from_cli_args(parse("--pdd-adaptive-rld-kv", "1.0", "--pdd-adaptive-md-batch", "0"))
    assert (cfg.adaptive_rld_kv, cfg.adaptive_md_batch) == (1.0, 0)


def test_seeded_sampling_is_on_for_roles_and_exported_for_a_plain_server_that_asks():
    assert PddConfig(role=Role.MAIN).honours_seeds and not PddConfig().honours_seeds
    assert not PddConfig(role=Role.MAIN, seeded_sampling="off").honours_seeds
    plain = config.from_cli_args(parse("--pdd-seeded-sampling", "on"))
    assert plain.honours_seeds and not plain.active
    env = {}
    plain.export_env(env)
    assert PddConfig.from_env(env).honours_seeds  # the schedulers of a plain server see it too
    env = {}
    PddConfig().export_env(env)
    assert config.ENV_CONFIG not in env


@pytest.mark.parametrize("role, argv, environ, match", [
    ("relay", ["--pdd-token-port", "18500"], {}, "SGLANG_PDD_SECRET .or SGLANG_PDD_SECRET_FILE. is not set"),
    ("main", [], {"SGLANG_PDD_SECRET": "x"}, "SGLANG_PDD_SECRET: the secret is 1 bytes, at least 16"),
    ("prefill", [], {"SGLANG_PDD_SECRET": "x", "SGLANG_PDD_SECRET_FILE": "f"}, "set one"),
    ("main", ["--pdd-token-curve", "on"], {"SGLANG_PDD_SECRET": "s" * 16}, "--pdd-token-curve on: no key"),
])
def test_start_up_refuses_a_bad_key_as_a_config_error_naming_it(monkeypatch, role, argv, environ, match):
    """The token channel's keys (protocol.keys) are read at start-up: their error is the launcher's
    PddConfigError, with the key's message."""
    for name in ("SGLANG_PDD_SECRET", "SGLANG_PDD_SECRET_FILE", "SGLANG_PDD_TOKEN_CURVE_KEY",
                 "SGLANG_PDD_TOKEN_CURVE_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    mode = "prefill" if role == "prefill" else "decode"
    with pytest.raises(PddConfigError, match=match):
        config.from_cli_args(parse("--pdd-role", role, *argv), disaggregation_mode=mode, decode_radix_cache=True)
    monkeypatch.setenv("SGLANG_PDD_SECRET", "s" * 16)  # the control: the same flags with a good key start
    monkeypatch.delenv("SGLANG_PDD_SECRET_FILE", raising=False)
    if "on" not in argv:
        assert config.from_cli_args(parse("--pdd-role", role, *argv), disaggregation_mode=mode,
                                    decode_radix_cache=True).role is Role(role)


def test_idle_wait_and_transfer_poll_default_on_for_pdd_roles_only():
    plain = PddConfig()
    assert plain.idle_wait_s == 0.0 and plain.transfer_poll_s == 0.0  # plain sglang spins as upstream
    for role in Role:
        cfg = PddConfig(role=role)
        assert cfg.idle_wait_s == config.ROLE_IDLE_WAIT_MS / 1e3 > 0
        assert cfg.transfer_poll_s == config.ROLE_TRANSFER_POLL_MS / 1e3 > 0
    opted_in = config.from_cli_args(parse("--pdd-idle-wait-ms", "3", "--pdd-transfer-poll-ms", "2"))
    assert not opted_in.active and opted_in.idle_wait_s == 0.003 and opted_in.transfer_poll_s == 0.002
    env = {}
    opted_in.export_env(env)  # a plain server's children see the opt-in
    assert PddConfig.from_env(env).idle_wait_s == 0.003
    off = config.from_cli_args(parse("--pdd-role", "prefill", "--pdd-idle-wait-ms", "0",
                                     "--pdd-transfer-poll-ms", "0"), disaggregation_mode="prefill")
    assert off.idle_wait_s == 0.0 and off.transfer_poll_s == 0.0
    assert "idle wait 0 ms" in off.describe() and "idle wait 3 ms" in opted_in.describe()


@pytest.mark.parametrize("flag", ["--pdd-idle-wait-ms", "--pdd-transfer-poll-ms"])
@pytest.mark.parametrize("value", ["-1", "1000.5"])
def test_idle_wait_and_transfer_poll_out_of_range_are_rejected(flag, value):
    with pytest.raises(PddConfigError, match=flag):
        config.from_cli_args(parse(flag, value))


def _relay(host, *argv):
    args = parse("--pdd-role", "relay", "--pdd-token-port", "18500", *argv)
    if host is not None:
        args.host = host  # sglang's --host (absent: sglang's default, 127.0.0.1)
    return config.from_cli_args(args, disaggregation_mode="decode")


@pytest.fixture
def no_curve(monkeypatch):
    for name in ("SGLANG_PDD_TOKEN_CURVE_KEY", "SGLANG_PDD_TOKEN_CURVE_KEY_FILE", "SGLANG_PDD_TOKEN_CURVE_CLIENTS",
                 "SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGLANG_PDD_SECRET", "s" * 16)


@pytest.mark.parametrize("host", ["10.0.0.5", "0.0.0.0", "", "::", "pdd-relay-0.pdd-relay.site-a.example"])
def test_a_relay_others_reach_refuses_a_token_channel_in_clear(no_curve, host):
    """Issue 47 item 4: the token channel carries every relayed request's output tokens; bound where other
    hosts reach it, with no CURVE key and no explicit `off`, the relay refuses to start, naming the flag."""
    with pytest.raises(PddConfigError, match=r"--pdd-token-curve auto: the token channel binds on .* in clear") as e:
        _relay(host)
    assert "SGLANG_PDD_TOKEN_CURVE_KEY" in str(e.value) and "--pdd-token-curve off" in str(e.value)
    assert _relay(host, "--pdd-token-curve", "off").token_curve == "off"  # the explicit opt-out starts


@pytest.mark.parametrize("host", [None, "127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_control_a_loopback_token_channel_may_stay_in_clear(no_curve, host):
    assert _relay(host).role is Role.RELAY  # nothing crosses a wire: the tests' one-box clusters


def test_control_an_encrypting_relay_starts_on_any_address(no_curve, monkeypatch):
    import zmq

    public, secret = zmq.curve_keypair()
    monkeypatch.setenv("SGLANG_PDD_TOKEN_CURVE_KEY", secret.decode())
    monkeypatch.setenv("SGLANG_PDD_TOKEN_CURVE_CLIENTS", zmq.curve_keypair()[0].decode())
    assert _relay("0.0.0.0").token_curve == "auto"
    monkeypatch.delenv("SGLANG_PDD_TOKEN_CURVE_KEY")  # `on` still asks for the key itself
    with pytest.raises(PddConfigError, match="--pdd-token-curve on: no key"):
        _relay("0.0.0.0", "--pdd-token-curve", "on")


def test_main_and_prefill_bind_no_token_channel(no_curve):
    for role, mode in (("main", "decode"), ("prefill", "prefill")):
        args = parse("--pdd-role", role)
        args.host = "0.0.0.0"
        assert config.from_cli_args(args, disaggregation_mode=mode, decode_radix_cache=True).role is Role(role)


def test_a_prefill_that_relays_needs_a_token_port_and_only_a_prefill_relays():
    cfg = config.from_cli_args(parse("--pdd-role", "prefill", "--pdd-relay", "local", "--pdd-token-port", "18592"),
                               disaggregation_mode="prefill")
    assert cfg.relays_locally and cfg.token_port == 18592
    assert not config.from_cli_args(parse("--pdd-role", "prefill"), disaggregation_mode="prefill").relays_locally
    with pytest.raises(PddConfigError, match="--pdd-relay local needs --pdd-token-port"):
        config.from_cli_args(parse("--pdd-role", "prefill", "--pdd-relay", "local"), disaggregation_mode="prefill")
    with pytest.raises(PddConfigError, match="--pdd-relay local is a prefill's flag"):
        config.from_cli_args(parse("--pdd-role", "main", "--pdd-relay", "local"), disaggregation_mode="decode",
                             decode_radix_cache=True)
