"""The test servers' fork switch (sglang_pdd.lab.compat.fork_children): off unless asked, and never with a
second thread alive, where a fork could copy a held lock."""

import multiprocessing as mp
import threading
import types

import pytest

from sglang_pdd.lab.compat import fork_children


@pytest.fixture
def one_thread(monkeypatch):
    """The launcher at sglang's fork: its main thread alone (a test process has others, e.g. the suite's)."""
    monkeypatch.setattr(fork_children, "_threads", lambda: [threading.main_thread()])


@pytest.fixture
def restore_start_method():
    before = mp.get_start_method(allow_none=True)
    yield
    mp.set_start_method(before, force=True)


def engine_module(calls: list):
    def set_envs_and_config(server_args):
        calls.append(server_args)
        mp.set_start_method("spawn", force=True)  # what sglang's does
        return "done"

    return types.SimpleNamespace(_set_envs_and_config=set_envs_and_config)


def test_off_unless_asked(monkeypatch, restore_start_method):
    monkeypatch.delenv(fork_children.ENV, raising=False)
    calls: list = []
    module = engine_module(calls)
    original = module._set_envs_and_config
    fork_children.patch_engine(module)
    assert module._set_envs_and_config is original
    monkeypatch.setenv(fork_children.ENV, "0")
    fork_children.patch_engine(module)
    assert module._set_envs_and_config is original and fork_children.start_method() == "spawn"


def test_asked_forks_after_sglangs_own_settings(monkeypatch, restore_start_method, one_thread):
    monkeypatch.setenv(fork_children.ENV, "1")
    calls: list = []
    module = engine_module(calls)
    fork_children.patch_engine(module)
    fork_children.patch_engine(module)  # idempotent: one wrapper
    assert module._set_envs_and_config("args") == "done" and calls == ["args"]
    assert mp.get_start_method() == "fork"


def test_a_second_thread_keeps_spawn(monkeypatch, restore_start_method, one_thread):
    monkeypatch.setenv(fork_children.ENV, "1")
    module = engine_module([])
    fork_children.patch_engine(module)
    assert fork_children.start_method() == "fork"  # the control: the main thread alone
    held = threading.Thread(target=lambda: None, name="held")
    monkeypatch.setattr(fork_children, "_threads", lambda: [threading.main_thread(), held])
    assert fork_children.start_method() == "spawn"
    module._set_envs_and_config("args")
    assert mp.get_start_method() == "spawn"


def test_a_forked_child_picks_prometheus_clients_value_class_again(tmp_path, monkeypatch):
    """The launcher imported prometheus_client before sglang set PROMETHEUS_MULTIPROC_DIR: a child must not
    keep the in-memory class (its counters would never reach the server's /metrics)."""
    import prometheus_client.values as values

    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    fork_children._child_picks_metric_values()
    assert values.ValueClass is not values.MutexValue  # the multiprocess (file-backed) class
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    fork_children._child_picks_metric_values()
    assert values.ValueClass is values.MutexValue
