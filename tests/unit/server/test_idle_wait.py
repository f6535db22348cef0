"""The idle wait (sglang_pdd.server.idle_wait, hooks/idle.py): what ends a wait, and when the hook waits."""

import threading

import pytest
import zmq

from sglang_pdd.server import idle_wait
from sglang_pdd.config import ENV_CONFIG, PddConfig
from sglang_pdd.hooks import idle
from sglang_pdd.server.roles import Role

LONG_S = 30.0  # a wait that must be ended by an event: were it not, the test would take this long and fail


@pytest.fixture(autouse=True)
def _fresh():
    idle_wait.reset_for_tests()
    yield
    idle_wait.reset_for_tests()


def test_a_wait_with_nothing_happening_ends_by_its_timeout():
    w = idle_wait.IdleWaiter(0.001)
    assert w.wait() is False
    assert (w.waits, w.woken) == (1, 0)


def test_wake_from_another_thread_ends_the_wait_and_is_drained():
    w = idle_wait.IdleWaiter(LONG_S)
    t = threading.Timer(0.05, w.wake)
    t.start()
    assert w.wait() is True
    t.join()
    w.timeout_s = 0.001
    assert w.wait() is False  # the wake-up was consumed: the next wait is not cut short by it


def test_a_wake_before_the_wait_is_not_lost():
    w = idle_wait.IdleWaiter(LONG_S)
    w.wake()
    w.wake()  # coalesced
    assert w.wait() is True


def test_a_readable_watched_socket_ends_the_wait_and_stays_readable():
    ctx = zmq.Context.instance()
    rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        rx.bind("inproc://idle-wait-test")
        tx.connect("inproc://idle-wait-test")
        w = idle_wait.IdleWaiter(LONG_S, (rx,))
        w.watch(rx)  # idempotent
        tx.send(b"req")
        assert w.wait() is True
        assert rx.recv(zmq.NOBLOCK) == b"req"  # the wait did not consume the message
    finally:
        rx.close(0)
        tx.close(0)


def test_sockets_watched_before_the_waiter_exists_are_taken_when_it_is_installed():
    ctx = zmq.Context.instance()
    rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        rx.bind("inproc://idle-wait-pending")
        tx.connect("inproc://idle-wait-pending")

        class Sched:
            idle_sleeper = None

        idle_wait.watch(Sched(), rx)  # e.g. RelayRuntime's token channel, created before the first idle
        w = idle_wait.install(LONG_S)
        tx.send(b"tok")
        assert w.wait() is True
    finally:
        rx.close(0)
        tx.close(0)


class FakeScheduler:
    def __init__(self, fully_idle: bool, sleeper: bool, tokenizer_socket: bool = True):
        self._fully_idle = fully_idle
        self.idle_sleeper = object() if sleeper else None
        self.recv_from_tokenizer = zmq.Context.instance().socket(zmq.PULL) if tokenizer_socket else None
        self.on_idle_calls = 0

    def is_fully_idle(self):
        return self._fully_idle

    def close(self):
        if self.recv_from_tokenizer is not None:
            self.recv_from_tokenizer.close(0)


def _original_on_idle(s):
    s.on_idle_calls += 1
    return "r"


def _run(monkeypatch, cfg: PddConfig | None, **sched):
    if cfg is None:
        monkeypatch.delenv(ENV_CONFIG, raising=False)
    else:
        monkeypatch.setenv(ENV_CONFIG, cfg.to_json())
    s = FakeScheduler(**sched)
    try:
        assert idle.around_on_idle(_original_on_idle, s) == "r"
        assert s.on_idle_calls == 1  # sglang's housekeeping always runs first
        w = idle.waiter(s)
        return w.waits if w is not None else None
    finally:
        s.close()


def test_the_hook_waits_when_work_is_in_flight_even_with_sleep_on_idle(monkeypatch):
    assert _run(monkeypatch, PddConfig(role=Role.RELAY, idle_wait_ms=0.5), fully_idle=False, sleeper=True) == 1


def test_the_hook_leaves_a_fully_idle_server_to_sleep_on_idle(monkeypatch):
    assert _run(monkeypatch, PddConfig(role=Role.MAIN, idle_wait_ms=0.5), fully_idle=True, sleeper=True) == 0


def test_without_sleep_on_idle_a_fully_idle_server_waits_too(monkeypatch):
    assert _run(monkeypatch, PddConfig(idle_wait_ms=0.5), fully_idle=True, sleeper=False) == 1


def test_a_plain_server_without_the_flag_spins_as_upstream(monkeypatch):
    assert _run(monkeypatch, None, fully_idle=False, sleeper=True) is None
    assert _run(monkeypatch, PddConfig(role=Role.PREFILL, idle_wait_ms=0.0), fully_idle=False, sleeper=True) is None


def test_a_rank_that_does_not_read_requests_never_waits(monkeypatch):
    # TP ranks > 0 block in rank 0's broadcast; waiting there too would delay every request
    assert _run(monkeypatch, PddConfig(role=Role.PREFILL), fully_idle=False, sleeper=False,
                tokenizer_socket=False) is None


def test_a_status_update_wakes_the_waiter_and_still_updates(monkeypatch):
    monkeypatch.delenv(ENV_CONFIG, raising=False)  # not a prefill: the refusal check passes through
    w = idle_wait.install(LONG_S)
    calls = []

    def update_status(manager, room, status):
        calls.append((room, status))

    class Manager:
        request_status = {}

    idle.around_update_status(update_status, Manager(), 7, 2)
    assert calls == [(7, 2)]
    assert w.wait() is True
