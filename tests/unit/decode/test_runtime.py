"""decode/runtime.py has rank 0's class picked once, by its role's control module (relay/controls.py,
main/controls.py): the plain RelayRuntime / MainRuntime in production, their subclasses with the tests'
negative controls when the process's test switches are on. The production modules do not know the
switches."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_pdd.server import idle_wait
from sglang_pdd.config import PddConfig
from sglang_pdd import test_switches
from sglang_pdd.decode import runtime as decode_runtime
from sglang_pdd.decode.main import controls as main_controls
from sglang_pdd.decode.main.controls import ControlledMainRuntime
from sglang_pdd.decode.main.runtime import MainRuntime
from sglang_pdd.decode.relay import controls as relay_controls
from sglang_pdd.decode.relay.controls import ControlledRelayRuntime, below_min_eager
from sglang_pdd.decode.relay.handoff import no_hold
from sglang_pdd.decode.relay.runtime import RelayRuntime
from sglang_pdd.server.roles import Role
from sglang_pdd.test_switches import OFF, TestSwitches

DECODE = Path(decode_runtime.__file__).parent
MAIN_HOOKS = ("_track", "_before_poll", "_attention_policy", "_before_select", "_hold_finals", "_after_final_extend")
ON = [TestSwitches(knobs_file="knobs.json"), TestSwitches(testing=True), TestSwitches("knobs.json", True)]
SECRET = b"a-test-secret-of-32-bytes-length"


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("SGLANG_PDD_SECRET", "a-test-secret-of-32-bytes-length")
    monkeypatch.setattr(idle_wait, "watch", lambda scheduler, sock: None)  # no process-wide poller


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leader(role: Role, switches: TestSwitches):
    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=1000), waiting_queue=[],
                                server_args=SimpleNamespace(host="127.0.0.1"))
    cfg = PddConfig(role=role, relays="tcp://127.0.0.1:1", token_port=_free_port())
    controls = relay_controls if role is Role.RELAY else main_controls
    rt = controls.for_process(scheduler, cfg, SECRET, switches)
    rt.channel.close()
    return rt


@pytest.mark.parametrize("role, plain, controlled", [
    (Role.MAIN, MainRuntime, ControlledMainRuntime), (Role.RELAY, RelayRuntime, ControlledRelayRuntime)])
def test_production_builds_the_plain_class_and_test_switches_the_controlled_one(role, plain, controlled):
    assert type(leader(role, OFF)) is plain
    for switches in ON:
        rt = leader(role, switches)
        assert type(rt) is controlled and rt.switches is switches


def test_the_runtime_takes_the_process_switches_once(monkeypatch):
    """Through `runtime(scheduler)`: the process's switches choose, and the runtime is kept."""
    switches = TestSwitches(testing=True)
    monkeypatch.setattr(test_switches, "for_process", lambda: switches)
    allocator = SimpleNamespace(get_kvcache=lambda: SimpleNamespace())  # no pool to warm the kernel up for
    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=1000), attn_tp_rank=0,
                                token_to_kv_pool_allocator=allocator)
    PddConfig(role=Role.MAIN, relays="tcp://127.0.0.1:1").export_env()
    try:
        rt = decode_runtime.runtime(scheduler)
        assert type(rt) is ControlledMainRuntime and rt.switches is switches
        assert decode_runtime.runtime(scheduler) is rt
        rt.channel.close()
    finally:
        PddConfig().export_env()


def test_the_controls_override_hooks_the_plain_classes_call():
    """A hook renamed on one side only would leave a control silently off."""
    for hook in MAIN_HOOKS:
        assert hook in vars(MainRuntime) and hook in vars(ControlledMainRuntime), hook
    assert leader(Role.RELAY, OFF).handoff.hold is no_hold
    assert all(leader(Role.RELAY, switches).handoff.hold is below_min_eager for switches in ON)


@pytest.mark.parametrize("module", ["main/runtime.py", "relay/runtime.py"])
def test_the_serving_modules_do_not_know_the_test_switches(module):
    source = (DECODE / module).read_text()
    assert "switches" not in source.lower() and "CPU_TEST_POLICY" not in source
