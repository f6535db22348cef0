"""The idle wait's two paths (patch 0005): the plugin's own on_idle hook on stock sglang, sglang's
`--idle-wait-ms` waiter on patched sglang (plugin.CAPABILITIES "idle wait").

Stock sglang is installed here, so the capability must be absent and the hook registered; the
routing of `watch`/`wake` to sglang's extension point and the server argument are tested with
stand-ins for sglang's two functions. test_patches.py (through patched_plugin_check.py) runs the
same code against sglang's real waiter on the patched copy.
"""

import os
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang.srt.plugins.hook_registry", reason="needs the sglang environment")

from sglang_pdd import plugin  # noqa: E402
from sglang_pdd.server import idle_wait
from sglang_pdd.config import PddConfig  # noqa: E402
from sglang_pdd.hooks import idle  # noqa: E402

ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
CAP = next(c for c in plugin.CAPABILITIES if c.patch == "0005")


@pytest.fixture(autouse=True)
def _fresh():
    idle_wait.reset_for_tests()
    yield
    idle_wait.reset_for_tests()


def test_the_capability_retires_the_on_idle_hook_only():
    assert CAP.name == "idle wait" and CAP.retires == (ON_IDLE,)
    assert CAP.resolve_use() is idle.use_idle_waiter


def test_on_stock_sglang_the_hook_waits():
    assert plugin.capability_paths()["idle wait"] is False
    assert ON_IDLE in {h.target for h in plugin.active_hooks()}


def test_negative_control_a_present_probe_drops_the_hook():
    present = plugin.Capability("idle wait", "0005", "logging:Logger.info", CAP.retires)
    assert ON_IDLE not in {h.target for h in plugin.active_hooks(caps=(present,))}


class _Upstream:
    def __init__(self):
        self.sources, self.notified = [], 0

    def register(self, source):
        self.sources.append(source)

    def notify(self):
        self.notified += 1


def test_with_the_extension_point_sockets_and_wake_ups_go_to_sglang():
    up = _Upstream()
    scheduler = SimpleNamespace(idle_sleeper=None)
    idle_wait.watch(scheduler, "early")  # a socket watched before the choice is handed over
    idle_wait.use_upstream(up.register, up.notify)
    idle_wait.watch(scheduler, "late")
    idle_wait.wake()
    assert up.sources == ["early", "late"] and up.notified == 1
    assert idle_wait.current() is None  # the plugin's own waiter is never installed


def test_without_the_extension_point_the_plugin_waiter_takes_them():
    r, w = os.pipe()
    try:
        idle_wait.watch(SimpleNamespace(idle_sleeper=None), r)
        waiter = idle_wait.install(0.0)
        assert waiter.wait() is False
        os.write(w, b"x")
        assert waiter.wait() is True  # the pending socket was handed to the plugin's waiter
        idle_wait.wake()
        assert waiter.wakeup is not None and waiter.wait() is True
    finally:
        os.close(r)
        os.close(w)


def _cfg(ms):
    return PddConfig(idle_wait_ms=ms)


def test_the_plugins_wait_becomes_sglangs_server_argument():
    given = SimpleNamespace(idle_wait_ms=0)
    idle_wait.configure_server_args(given, _cfg(5.0))
    assert given.idle_wait_ms == 5.0
    explicit = SimpleNamespace(idle_wait_ms=2)  # --idle-wait-ms given: it wins
    idle_wait.configure_server_args(explicit, _cfg(5.0))
    assert explicit.idle_wait_ms == 2
    off = SimpleNamespace(idle_wait_ms=0)
    idle_wait.configure_server_args(off, _cfg(0.0))
    assert off.idle_wait_ms == 0
    stock = SimpleNamespace()  # no such argument: nothing added
    idle_wait.configure_server_args(stock, _cfg(5.0))
    assert not hasattr(stock, "idle_wait_ms")
