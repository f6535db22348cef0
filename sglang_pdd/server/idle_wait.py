"""Wait, not spin, while a scheduler has nothing to compute but work in flight (`--pdd-idle-wait-ms`).

sglang 0.5.23's scheduler loops never block: each iteration reads its sockets without waiting, polls
its transfer queues, and, with no batch to run, calls `Scheduler.on_idle`. There, a PD server with
anything in flight (a KV transfer, a bootstrap, on MainDecode a handoff waiting for RelayDecode's
tokens: `Scheduler.is_fully_idle` is False) returns at once after `time.sleep(0)`
(managers/scheduler.py, `on_idle`, the `if not fully_idle:` branch); `--sleep-on-idle` only sleeps
(`IdleSleeper.maybe_sleep`, a zmq poll of up to 1 s) once nothing is in flight at all. So while a
transfer crosses the WAN for seconds, P, RLD and MD each spin a core on an empty loop.

`IdleWaiter.wait()` is what the plugin's `on_idle` hook (hooks/idle.py) adds in that case: a zmq poll
of the scheduler's request sockets, the token channel's sockets (`watch`), and a wake-up file
descriptor that the KV manager's status updates set (`wake`, from Mooncake's threads: a transfer
done, a bootstrap arrived), for at most `timeout_s`. Whatever the loop was waiting for wakes it at
once; the timeout only bounds what nothing signals (sglang's own timers, the fan-out's bookkeeping).

On an sglang with patch 0005 (`--idle-wait-ms`, patches/) sglang's own IdleWaiter does all this:
`use_upstream` routes `watch` to its `register_idle_wake_source` and `wake` to its
`notify_idle_waiters`, and the plugin's waiter is never installed (hooks/idle.py).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import zmq

logger = logging.getLogger(__name__)


class Wakeup:
    """A file descriptor that becomes readable when `set()` is called from any thread (eventfd,
    or a pipe where there is none); `clear()` drains it."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self._r = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._token = (1).to_bytes(8, "little")
        else:  # pragma: no cover - Linux has eventfd
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            self._token = b"x"

    def fileno(self) -> int:
        return self._r

    def set(self) -> None:
        try:
            os.write(self._w, self._token)
        except (BlockingIOError, OSError):  # full (already readable) or closed at shutdown
            pass

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass


class IdleWaiter:
    """One per scheduler process: what its idle loop waits on, and for how long at most."""

    def __init__(self, timeout_s: float, sockets: tuple[Any, ...] = ()) -> None:
        self.timeout_s = float(timeout_s)
        self.wakeup = Wakeup()
        self._poller = zmq.Poller()
        self._poller.register(self.wakeup.fileno(), zmq.POLLIN)
        self._watched: set[int] = set()
        self.waits = 0  # waits that ended by the timeout or by an event
        self.woken = 0  # of those, ended by an event
        for s in sockets:
            self.watch(s)

    def watch(self, sock: Any) -> None:
        """Also end a wait when `sock` (a zmq socket or a file descriptor) has something to read."""
        if sock is None or id(sock) in self._watched:
            return
        self._poller.register(sock, zmq.POLLIN)
        self._watched.add(id(sock))

    def wake(self) -> None:
        """End the current wait (or the next one), from any thread."""
        self.wakeup.set()

    def wait(self) -> bool:
        """Block until a watched socket is readable, `wake()` was called, or the timeout; True when
        something (not the timeout) ended it."""
        events = self._poller.poll(self.timeout_s * 1000.0)
        self.wakeup.clear()  # drain first: a wake after this is seen by the next wait
        self.waits += 1
        if events:
            self.woken += 1
        return bool(events)


_lock = threading.Lock()
_waiter: IdleWaiter | None = None
_pending: list[Any] = []  # sockets watched before the waiter existed (it takes them when installed)


def install(timeout_s: float, sockets: tuple[Any, ...] = ()) -> IdleWaiter:
    """This process's waiter (created once; a second scheduler in the process shares it)."""
    global _waiter
    with _lock:
        if _waiter is None:
            _waiter = IdleWaiter(timeout_s, tuple(sockets) + tuple(_pending))
            _pending.clear()
            logger.info("sglang-pdd: idle scheduler waits up to %.1f ms on in-flight work instead of spinning",
                        timeout_s * 1e3)
        else:
            for s in sockets:
                _waiter.watch(s)
        return _waiter


_upstream: tuple[Any, Any] | None = None  # sglang's (register_idle_wake_source, notify_idle_waiters)


def use_upstream(register: Any, notify: Any) -> None:
    """Patch 0005: sglang waits; our sockets become its wake sources, our wake-ups its notifications."""
    global _upstream
    _upstream = (register, notify)
    for s in _pending:
        register(s)
    _pending.clear()


def configure_server_args(server_args: Any, cfg: Any) -> None:
    """Where sglang has `--idle-wait-ms` (patch 0005) and it was not given, take the plugin's wait
    (`cfg`: the PddConfig)."""
    if getattr(server_args, "idle_wait_ms", None) == 0 and cfg.idle_wait_s > 0:
        server_args.idle_wait_ms = cfg.idle_wait_s * 1e3


def current() -> IdleWaiter | None:
    return _waiter


def wake() -> None:
    """Called where in-flight work changes state (the KV manager's status updates)."""
    if _upstream is not None:
        _upstream[1]()
        return
    w = _waiter
    if w is not None:
        w.wake()


def watch(scheduler: Any, sock: Any) -> None:
    """Make `sock` end the scheduler's idle waits: sglang's `--sleep-on-idle` poller, and ours."""
    sleeper = getattr(scheduler, "idle_sleeper", None)
    if sleeper is not None and hasattr(sleeper, "poller"):
        sleeper.poller.register(sock, zmq.POLLIN)
    if _upstream is not None:
        _upstream[0](sock)
        return
    w = _waiter
    if w is not None:
        w.watch(sock)
    else:
        _pending.append(sock)


def reset_for_tests() -> None:
    global _waiter, _upstream
    with _lock:
        _waiter = _upstream = None
    _pending.clear()
