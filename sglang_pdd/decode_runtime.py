"""The decode runtime of an sglang scheduler: RelayDecode's `RelayRuntime` or MainDecode's `MainRuntime`.

`runtime(scheduler)` creates and starts it on first use (attention-TP rank 0 of a relay or main
server; None elsewhere) and keeps it on the scheduler. sglang reaches it through one of two entries,
chosen at load (plugin.CAPABILITIES): on stock sglang the six decode scheduler hooks
(hooks/decode.py) call it on first use; on sglang with patch 0003 the decode scheduler extension
(decode_extension.py) is created with it when sglang builds the scheduler.
"""

from __future__ import annotations

from sglang_pdd.config import PddConfig
from sglang_pdd.decode_role import DecodeRole
from sglang_pdd.roles import Role
from sglang_pdd.test_switches import for_process

_UNSET = object()


def runtime(scheduler) -> DecodeRole | None:
    """The scheduler's RelayRuntime / MainRuntime, created and started on first use; None when inert."""
    rt = getattr(scheduler, "_pdd_runtime", _UNSET)
    if rt is not _UNSET:
        return rt
    rt = None
    cfg = PddConfig.from_env()
    if cfg.role in (Role.RELAY, Role.MAIN) and getattr(scheduler, "attn_tp_rank", 0) == 0:
        secret = cfg.secret()
        if cfg.role is Role.RELAY:
            from sglang_pdd.relay.runtime import RelayRuntime

            rt = RelayRuntime(scheduler, cfg, secret, for_process())
        else:
            from sglang_pdd.main.runtime import MainRuntime  # torch and the kernels only in a MainDecode process

            rt = MainRuntime(scheduler, cfg, secret, for_process())
        rt.start()
    scheduler._pdd_runtime = rt
    return rt


def current(scheduler) -> DecodeRole | None:
    """The runtime if it exists already (never creates one)."""
    return getattr(scheduler, "_pdd_runtime", None)
