"""Mooncake writes waited for with sleeps (sglang_pdd.transfer.write_wait), on a fake binding."""

from sglang_pdd.hooks import transfer as transfer_hooks
from sglang_pdd.transfer import write_wait

from tests.fakes.clock import FakeClock


class FakeBinding:
    """transfer_submit_write / transfer_check_status: each slice reports `pending` checks of 0 first."""

    def __init__(self, pending=(3,), final=write_wait.DONE, refuse_at=None):
        self.pending, self.final, self.refuse_at = list(pending), final, refuse_at
        self.submitted, self.checks = [], {}

    def transfer_submit_write(self, session, buf, peer, length):
        i = len(self.submitted)
        if self.refuse_at == i:
            return (1 << 64) - 1
        self.submitted.append((session, buf, peer, length))
        self.checks[i + 100] = 0
        return i + 100

    def transfer_check_status(self, bid):
        i = bid - 100
        self.checks[bid] += 1
        need = self.pending[i] if i < len(self.pending) else 0
        if self.checks[bid] <= need:
            return write_wait.PENDING
        return self.final


def _write(b, n=3, cap=1e-3, clock=None):
    clock = clock or FakeClock()
    ret = write_wait.write(b, "peer:1", [10 * i for i in range(n)], [20 * i for i in range(n)], [4096] * n, cap,
                           sleep=clock.sleep, clock=clock)
    return ret, clock


def test_every_slice_is_submitted_then_waited_for_with_backed_off_capped_sleeps():
    b = FakeBinding(pending=(12, 0, 2))
    ret, clock = _write(b)
    assert ret == 0
    assert [s[1:] for s in b.submitted] == [(0, 0, 4096), (10, 20, 4096), (20, 40, 4096)]
    assert all(b.checks[100 + i] >= 1 for i in range(3))  # each slice checked to completion
    assert clock.naps[0] == write_wait.FIRST_SLEEP_S and max(clock.naps) == 1e-3
    assert clock.naps == sorted(clock.naps)  # backs off, never shortens within a write
    assert len(clock.naps) == 12 + 0 + 2  # one nap per pending check (the fake counts checks), none once done


def test_a_failed_slice_fails_the_write():
    ret, _ = _write(FakeBinding(pending=(1, 1, 1), final=write_wait.FAILED))
    assert ret == -1


def test_a_refused_submission_fails_but_waits_for_what_was_submitted():
    b = FakeBinding(pending=(2, 2), refuse_at=2)
    ret, _ = _write(b)
    assert ret == -1 and len(b.submitted) == 2
    assert b.checks[100] == 3 and b.checks[101] == 3  # both landed before the write returned


def test_a_write_that_never_finishes_times_out_as_mooncake_does(monkeypatch):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")
    assert write_wait.timeout_s(1 << 30) == 6.0
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")  # Mooncake's floor is 5 s
    assert write_wait.timeout_s(0) == 5.0
    ret, clock = _write(FakeBinding(pending=(10 ** 9,)), n=1, cap=0.5)
    assert ret == -1 and 5.0 < clock.t < 6.0


def test_mismatched_lists_fail_without_submitting():
    b = FakeBinding()
    assert write_wait.write(b, "p", [1, 2], [1], [1, 1], 1e-3) == -1 and not b.submitted


class Engine:
    """sglang's MooncakeTransferEngine: `.engine` is the binding."""

    def __init__(self, binding):
        self.engine = binding


def _sync_original(engine, session_id, buffers, peers, lengths):
    engine.sync_calls = getattr(engine, "sync_calls", 0) + 1
    return 0


def test_the_hook_polls_when_configured_and_calls_mooncakes_sync_write_when_not(monkeypatch):
    b = FakeBinding(pending=(0, 0))
    e = Engine(b)
    monkeypatch.setattr(transfer_hooks, "_poll_s", 1e-4)
    assert transfer_hooks.around_batch_transfer_sync(_sync_original, e, "s", [1, 2], [3, 4], [5, 6]) == 0
    assert len(b.submitted) == 2 and not hasattr(e, "sync_calls")
    monkeypatch.setattr(transfer_hooks, "_poll_s", 0.0)
    assert transfer_hooks.around_batch_transfer_sync(_sync_original, e, "s", [1], [3], [5]) == 0
    assert e.sync_calls == 1 and len(b.submitted) == 2
    e2 = Engine(object())  # a binding without the calls: the sync write
    monkeypatch.setattr(transfer_hooks, "_poll_s", 1e-4)
    assert transfer_hooks.around_batch_transfer_sync(_sync_original, e2, "s", [1], [3], [5]) == 0
    assert e2.sync_calls == 1
