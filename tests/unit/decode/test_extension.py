"""Both entries into RLD's and MD's decode runtime make the same calls: the six hooks (stock sglang)
and the decode scheduler extension sglang calls with patch 0003 (sglang_pdd.decode.extension).

Runs on stock sglang: DecodeExtension implements sglang's extension contract without its base class;
tests/unit/plugin/test_patches.py (tests/unit/plugin/patched_plugin_check.py) drives it through sglang's own scheduler."""

from types import SimpleNamespace

import pytest

from sglang_pdd.decode import extension as decode_extension
from sglang_pdd.config import ENV_CONFIG
from sglang_pdd.hooks import decode as decode_hooks

from tests.fakes.decode_role import RecordingRole, decode_scheduler

pytest.importorskip("sglang")


@pytest.fixture
def scheduler(monkeypatch):
    return decode_scheduler(monkeypatch, main_role)


def main_role(scheduler) -> RecordingRole:
    """MD's runtime with a batch of its own (`extend`) that answers `merged` for the running batch."""
    return RecordingRole(scheduler, "main", batch=SimpleNamespace(name="extend"), running="merged")


def drive_hooks(s) -> list:
    out = []
    decode_hooks.after_add_request_to_queue(None, s, SimpleNamespace(rid="a"))
    decode_hooks.after_add_request_to_queue(None, s, SimpleNamespace(rid="r"), is_retracted=True)
    decode_hooks.around_process_decode_queue(lambda sch: None, s)
    plan = decode_hooks.around_get_next_disagg_decode_batch_to_run(lambda sch, rb: "sglang's", s, "running")
    out.append((plan.batch_to_run.name, plan.running_batch))
    out.append(decode_hooks.around_process_batch_result(lambda sch, b, r: "sglang's", s, s._pdd_runtime.batch, 1))
    out.append(decode_hooks.around_process_batch_result(lambda sch, b, r: "sglang's", s,
                                                        SimpleNamespace(name="decode"), 2))
    s._pdd_runtime.held = True
    out.append(decode_hooks.after_is_fully_idle(True, s))
    s._pdd_runtime.held = False
    out.append(decode_hooks.after_is_fully_idle(True, s))
    decode_hooks.after_abort_request(None, s, SimpleNamespace(rid="a", abort_message="bye", abort_all=False))
    return out


def drive_extension(s) -> list:
    """What sglang's scheduler does at the same places with patch 0003 (a retracted request is not
    offered; a result not consumed goes on to sglang's processing; idle = not pending work)."""
    ext = decode_extension.create(s)
    out = []
    ext.on_request_queued(SimpleNamespace(rid="a"))
    ext.poll()
    batch, running = ext.get_next_batch("running")
    out.append((batch.name, running))
    out.append(None if ext.process_batch_result(s._pdd_runtime.batch, 1) else "sglang's")
    out.append(None if ext.process_batch_result(SimpleNamespace(name="decode"), 2) else "sglang's")
    s._pdd_runtime.held = True
    out.append(not ext.has_pending_work())
    s._pdd_runtime.held = False
    out.append(not ext.has_pending_work())
    ext.on_abort_request(SimpleNamespace(rid="a", abort_message="bye", abort_all=False))
    return out


def test_the_extension_makes_the_calls_the_hooks_make(scheduler):
    hooks_out = drive_hooks(scheduler)
    hooks_calls = scheduler._pdd_runtime.calls
    other = SimpleNamespace(dp_attn_adapter=scheduler.dp_attn_adapter)
    other._pdd_runtime = main_role(other)
    assert drive_extension(other) == hooks_out == [("extend", "merged"), None, "sglang's", False, True]
    assert other._pdd_runtime.calls == hooks_calls == [
        ("admit", "a"), ("poll",), ("next_batch", "running"), ("result", "extend", 1), ("result", "decode", 2),
        ("abort", "a", "bye", False)]


def test_inert_scheduler_gets_no_extension_and_reports_no_path(monkeypatch):
    monkeypatch.delenv(ENV_CONFIG, raising=False)  # no --pdd-role: a plain decode server
    s = SimpleNamespace()
    assert decode_extension.create(s) is None and decode_extension.path(s) is None


def test_the_path_says_which_entry_serves_the_runtime(scheduler):
    assert decode_extension.path(scheduler) == "hooks"
    scheduler.decode_extension = decode_extension.create(scheduler)
    assert decode_extension.path(scheduler) == "extension"


def test_a_decode_server_reports_its_path_in_server_info(scheduler, monkeypatch):
    from sglang_pdd.hooks import server_info

    monkeypatch.setattr(server_info, "_active", lambda: True)
    scheduler.decode_extension = decode_extension.create(scheduler)
    result = SimpleNamespace(internal_state={})
    server_info.after_get_internal_state(result, SimpleNamespace(scheduler=scheduler))
    assert result.internal_state[decode_extension.KEY] == "extension"
