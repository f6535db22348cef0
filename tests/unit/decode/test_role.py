"""The decode hooks call one DecodeRole method each; the base publishes gauges at a bounded rate."""

from types import SimpleNamespace

from sglang_pdd.decode import role as decode_role
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.hooks import decode as decode_hooks

from tests.fakes.decode_role import decode_scheduler


class Role(DecodeRole):
    """RLD's runtime on DecodeRole's defaults (not tests.fakes' RecordingRole): only poll and busy its own."""

    role = "relay"

    def __init__(self, scheduler):
        super().__init__(scheduler)
        self.calls, self.is_busy = [], False

    def poll(self):
        self.calls.append("poll")

    def busy(self):
        return self.is_busy


def setup(monkeypatch):
    scheduler = decode_scheduler(monkeypatch, Role)
    return scheduler, scheduler._pdd_runtime, scheduler.published


def test_the_defaults_leave_sglang_alone(monkeypatch):
    scheduler, rt, _ = setup(monkeypatch)
    assert DecodeRole(scheduler).next_batch("running") == (None, "running")
    assert decode_hooks.around_process_batch_result(lambda s, b, r: "sglang's", scheduler, "b", "r") == "sglang's"
    assert decode_hooks.around_get_next_disagg_decode_batch_to_run(lambda s, rb: ("orig", rb), scheduler, "rb") \
        == ("orig", "rb")
    decode_hooks.after_abort_request(None, scheduler, SimpleNamespace(rid="x"))


def test_gauges_are_published_at_a_bounded_rate_and_when_going_idle(monkeypatch):
    scheduler, rt, published = setup(monkeypatch)
    clock = [100.0]
    monkeypatch.setattr(decode_role.time, "monotonic", lambda: clock[0])
    for _ in range(3):
        decode_hooks.around_process_decode_queue(lambda s: None, scheduler)
    assert rt.calls == ["poll"] * 3 and published == ["relay"]
    clock[0] += 0.1
    decode_hooks.around_process_decode_queue(lambda s: None, scheduler)
    assert published == ["relay"]
    rt.is_busy = True
    assert decode_hooks.after_is_fully_idle(True, scheduler) is False and published == ["relay"]
    rt.is_busy = False
    assert decode_hooks.after_is_fully_idle(True, scheduler) is True and published == ["relay", "relay"]
    assert decode_hooks.after_is_fully_idle(True, scheduler) is True and len(published) == 2
    assert decode_hooks.after_is_fully_idle(False, scheduler) is False
