import importlib.metadata

import pytest

pytest.importorskip("sglang.srt.plugins.hook_registry", reason="needs the sglang environment")

from sglang_pdd import plugin  # noqa: E402


def test_entry_point_names_the_loader():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert any(ep.name == "pdd" and ep.value == "sglang_pdd.plugin:load" for ep in eps)


def test_every_hook_target_exists_in_the_installed_sglang():
    assert plugin.missing_targets() == []


def test_a_renamed_target_is_reported_by_name():
    hooks = (
        plugin.Hook("sglang.srt.managers.scheduler.Scheduler.no_such_method", "transfer:around_send_aux", "AROUND"),
        plugin.Hook("sglang.srt.no_such_module.Thing.fn", "transfer:around_send_aux", "AROUND"),
    )
    missing = plugin.missing_targets(hooks)
    assert len(missing) == 2
    assert "Scheduler.no_such_method (no attribute 'no_such_method'" in missing[0]
    assert missing[1].startswith("sglang.srt.no_such_module.Thing.fn (")


def test_every_hook_body_resolves():
    for h in plugin.HOOKS:
        assert callable(h.resolve_body()), h.body


def test_load_is_idempotent_and_hooks_apply(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setattr(plugin, "_loaded", False)
    with pytest.raises(plugin.PluginLoadError, match="never registered"):
        plugin.require_hooks_applied()
    plugin.load()
    plugin.load()
    per_target = {t: sum(1 for h in plugin.HOOKS if h.target == t) for t in {h.target for h in plugin.HOOKS}}
    assert all(len(HookRegistry._hooks[t]) == n for t, n in per_target.items())  # each once, however often load()
    with pytest.raises(plugin.PluginLoadError, match="not applied"):
        plugin.require_hooks_applied()
    import pkgutil

    missing = object()
    originals = {}
    for h in plugin.HOOKS:
        owner, _, attr = h.target.rpartition(".")
        obj = pkgutil.resolve_name(owner)
        originals[(obj, attr)] = obj.__dict__.get(attr, missing)  # mixin methods live on a base class
    try:
        HookRegistry.apply_hooks()
        plugin.require_hooks_applied()
    finally:
        for (obj, attr), orig in originals.items():
            if orig is missing:
                delattr(obj, attr)
            else:
                setattr(obj, attr, orig)


def test_the_server_args_hook_is_passed_the_plugins_check():
    (h,) = [h for h in plugin.HOOKS if h.body == "server_args:after_from_cli_args"]
    assert h.resolve_body().keywords == {"require_hooks_applied": plugin.require_hooks_applied}


def test_no_hook_module_imports_another_hook_module_or_the_plugin():
    import ast
    import pathlib

    import sglang_pdd.hooks

    for path in pathlib.Path(sglang_pdd.hooks.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad = [n for n in names if n.startswith("sglang_pdd.hooks") or n in ("sglang_pdd.plugin",)]
            assert not bad, f"{path.name} imports {bad}"
