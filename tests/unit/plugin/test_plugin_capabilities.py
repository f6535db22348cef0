"""The plugin's choice at load between a hook and an extension point of patches/ (plugin.CAPABILITIES).

On the installed (stock) sglang every capability takes its hook; tests/unit/plugin/test_patches.py checks
that on the patched copy every capability takes sglang's extension point instead.
"""

import logging

import pytest

pytest.importorskip("sglang.srt.plugins.hook_registry", reason="needs the sglang environment")

from sglang_pdd import plugin  # noqa: E402

TARGETS = {h.target for h in plugin.HOOKS}


def test_every_capability_retires_hooks_of_the_table_and_probes_sglang():
    for cap in plugin.CAPABILITIES:
        assert cap.retires and set(cap.retires) <= TARGETS, cap
        assert cap.probe.startswith("sglang.srt.") and ":" in cap.probe, cap
        assert cap.patch.isdigit() and len(cap.patch) == 4, cap


def test_on_stock_sglang_every_capability_takes_its_hook(caplog):
    assert not any(plugin.capability_paths().values())
    assert plugin.active_hooks() == plugin.HOOKS
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin._log_capabilities()
    assert "input validation: hook (stock sglang, patch 0001 not applied)" in caplog.text


def test_an_extension_point_that_exists_retires_its_hooks(caplog):
    target = plugin.HOOKS[2].target
    present = plugin.Capability("thing", "0009", "logging:Logger.info", (target,))
    absent = plugin.Capability("other", "0010", "sglang.srt.no_such_module:Nothing", (plugin.HOOKS[3].target,))
    hooks = plugin.active_hooks(caps=(present, absent))
    assert [h.target for h in hooks] == [h.target for h in plugin.HOOKS if h.target != target]
    assert plugin.capability_paths((present, absent)) == {"thing": True, "other": False}
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin._log_capabilities((present, absent))
    assert f"thing: sglang's extension point (patch 0009); hook not registered: {target}" in caplog.text
    assert "other: hook (stock sglang, patch 0010 not applied)" in caplog.text


def test_load_records_the_choice_and_a_pdd_server_reports_it(monkeypatch):
    from types import SimpleNamespace

    from sglang_pdd.hooks import server_info
    from sglang_pdd.process_state import capabilities

    capabilities.record(plugin.capability_paths())
    assert capabilities.CHOSEN == {c.name: False for c in plugin.CAPABILITIES}
    monkeypatch.setattr(server_info, "_active", lambda: True)
    result = SimpleNamespace(internal_state={"x": 1})
    controller = SimpleNamespace(scheduler=None)  # not a prefill: P's pool state is not added
    assert server_info.after_get_internal_state(result, controller) is result
    assert result.internal_state == {"x": 1, capabilities.KEY: capabilities.CHOSEN}
    monkeypatch.setattr(server_info, "_active", lambda: False)  # a server without --pdd-role
    result = SimpleNamespace(internal_state={})
    server_info.after_get_internal_state(result, controller)
    assert result.internal_state == {}


def test_every_capability_hands_the_plugin_a_callable_or_needs_none():
    for cap in plugin.CAPABILITIES:
        use = cap.resolve_use()
        assert use is None or callable(use), cap
    assert [c.patch for c in plugin.CAPABILITIES if c.use] == ["0002", "0003", "0004", "0005"]


def test_the_ledger_covers_every_hook_and_counts_the_ported_retirements():
    from pathlib import Path

    ledger = (Path(__file__).resolve().parents[3] / "patches" / "LEDGER.md").read_text()
    rows = [line for line in ledger.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert len(rows) == len(plugin.HOOKS)
    for h in plugin.HOOKS:
        assert any(f"`{h.target.removeprefix('sglang.srt.')}`" in r for r in rows), h.target
    retired = {t for c in plugin.CAPABILITIES for t in c.retires}
    ported = [r for r in rows if ", ported" in r]
    assert len(ported) == len(retired)
    patched = sum(1 for h in plugin.HOOKS if h.target not in retired or not h.retirable)
    assert f"Registered: **{len(plugin.HOOKS)} on stock sglang, {patched} on patched" in ledger
