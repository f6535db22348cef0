import argparse

import pytest

from sglang_pdd import config
from sglang_pdd.config import PddConfig, PddConfigError
from sglang_pdd.roles import Role


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
