"""`sglang_pdd.Engine(**kwargs)`: the plugin's options as keywords, checked as on the command line
(the engine itself is started in tests/e2e/test_inert_plugin.py)."""

import pytest

pytest.importorskip("sglang")

from sglang_pdd import engine  # noqa: E402
from sglang_pdd.config import ENV_CONFIG, PddConfig  # noqa: E402

CPU = dict(model_path="unused", device="cpu", disable_cuda_graph=True)


@pytest.fixture(autouse=True)
def no_plugin_loading(monkeypatch):
    """sglang's load_plugins() applies the plugin's hooks to sglang's classes for the whole process
    (its parser would then carry --pdd-* twice in other tests); the engine's own start loads them."""
    import sglang.srt.plugins

    monkeypatch.setattr(sglang.srt.plugins, "load_plugins", lambda: None)


def test_the_plugins_keywords_are_split_from_sglangs():
    pdd, rest = engine.split({"pdd_role": "main", "tp_size": 1, "pdd_relays": "tcp://r:1"})
    assert pdd == {"pdd_role": "main", "pdd_relays": "tcp://r:1"} and rest == {"tp_size": 1}
    with pytest.raises(TypeError, match="unknown option pdd_rol"):
        engine.split({"pdd_rol": "main"})


@pytest.mark.parametrize("kwargs, words", [
    (dict(pdd_role="relai"), "--pdd-role"),
    (dict(pdd_role="main", disaggregation_mode="decode"), "--disaggregation-decode-enable-radix-cache"),
    (dict(pdd_role="relay", disaggregation_mode="decode", pdd_token_port=18500, pp_size=2), "--pp-size 1"),
    (dict(pdd_role="relay", disaggregation_mode="null", pdd_token_port=18500), "--disaggregation-mode decode"),
])
def test_bad_options_are_refused_with_the_command_lines_message(kwargs, words, monkeypatch):
    monkeypatch.setenv("SGLANG_PDD_SECRET", "sixteen-byte-key")
    with pytest.raises(ValueError, match="sglang-pdd: error: .*" + words.replace("-", r"\-")):
        engine.server_args_and_config(**CPU, **kwargs)


def test_good_options_give_the_config_the_launcher_would(monkeypatch):
    monkeypatch.setenv("SGLANG_PDD_SECRET", "sixteen-byte-key")
    sa, cfg = engine.server_args_and_config(**CPU, disaggregation_mode="decode", pdd_role="main",
                                            disaggregation_decode_enable_radix_cache=True,
                                            disable_overlap_schedule=True, pdd_relays="tcp://10.0.0.1:18500",
                                            pdd_handoff_mode="catch-up")
    assert cfg.role.value == "main" and cfg.relays == "tcp://10.0.0.1:18500" and cfg.handoff_mode == "catch-up"
    assert sa.disaggregation_mode == "decode" and not hasattr(sa, "pdd_role")


def test_engine_exports_the_config_and_starts_sglangs_engine_with_the_rest(monkeypatch):
    import os

    import sglang

    started = {}
    monkeypatch.setattr(sglang, "Engine", lambda **kw: started.update(kw) or "engine")
    saved = os.environ.pop(ENV_CONFIG, None)
    try:
        assert engine.Engine(**CPU, pdd_seeded_sampling="on") == "engine"
        assert set(started) == {"server_args"} and started["server_args"].model_path == "unused"
        assert PddConfig.from_env(os.environ).seeded_sampling == "on"  # what the engine's processes read
        with pytest.raises(TypeError, match="not with server_args"):
            engine.Engine(server_args=started["server_args"], pdd_seeded_sampling="on")
    finally:  # the export is process-wide: leave nothing for later tests' servers
        os.environ.pop(ENV_CONFIG, None)
        if saved is not None:
            os.environ[ENV_CONFIG] = saved
