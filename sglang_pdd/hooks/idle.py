"""Scheduler idle hooks: wait on in-flight work instead of spinning (`--pdd-idle-wait-ms`).

Inert (one attribute read per idle iteration) unless the config sets an idle wait: every PDD role
by default, a plain server when it passes the flag. The logic is sglang_pdd.server.idle_wait.

On an sglang with patch 0005 the `on_idle` hook is not registered (plugin.CAPABILITIES):
`use_idle_waiter` hands the token channel's sockets and the wake-ups to sglang's IdleWaiter, and
`idle_wait.configure_server_args` sets sglang's `--idle-wait-ms` from the plugin's (unless given).
"""

from __future__ import annotations

import zmq

from sglang_pdd.server import idle_wait
from sglang_pdd.config import PddConfig
from sglang_pdd.process_state import fanout
from sglang_pdd.transfer.mooncake_fanout import REFUSED_REASON, refuse_room

_UNSET = object()


def waiter(scheduler):
    """The scheduler's IdleWaiter, or None: no idle wait configured, or a rank that does not read
    requests itself (TP/PP ranks other than 0 block in the broadcast from rank 0 instead)."""
    w = getattr(scheduler, "_pdd_idle_waiter", _UNSET)
    if w is not _UNSET:
        return w
    w = None
    timeout = PddConfig.from_env().idle_wait_s
    tok = getattr(scheduler, "recv_from_tokenizer", None)
    if timeout > 0 and isinstance(tok, zmq.Socket):
        rpc = getattr(getattr(scheduler, "ipc_channels", None), "recv_from_rpc", None)
        w = idle_wait.install(timeout, (tok, rpc))
    scheduler._pdd_idle_waiter = w
    return w


def use_idle_waiter() -> None:
    """Patch 0005's extension point: sglang's waiter watches our sockets and takes our wake-ups."""
    from sglang.srt.managers.scheduler_components.idle_waiter import (notify_idle_waiters,
                                                                      register_idle_wake_source)

    idle_wait.use_upstream(register_idle_wake_source, notify_idle_waiters)


def around_on_idle(original, scheduler, *a, **kw):
    result = original(scheduler, *a, **kw)
    w = waiter(scheduler)
    if w is None:
        return result
    if getattr(scheduler, "idle_sleeper", None) is not None and scheduler.is_fully_idle():
        return result  # nothing in flight: --sleep-on-idle's poll already waited
    w.wait()
    return result


def around_update_status(original, manager, room, status, *a, **kw):
    """A transfer or bootstrap changed state (often from one of Mooncake's threads): wake the idle
    scheduler. Also P's refusal of late registrations (process_state.fanout), on the same target."""
    try:
        if fanout.refuses_registration(manager, room, status):
            return refuse_room(manager, room, REFUSED_REASON)
        return original(manager, room, status, *a, **kw)
    finally:
        idle_wait.wake()
