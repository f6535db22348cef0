"""Decode scheduler hooks shared by RelayDecode and MainDecode; each delegates to its role's runtime.

Without a PDD role (or on prefill) every body returns at once and sglang runs unchanged.
"""

from __future__ import annotations

import logging

from sglang_pdd.config import PddConfig
from sglang_pdd.decode_role import DecodeRole
from sglang_pdd.request_errors import end_queued
from sglang_pdd.roles import Role
from sglang_pdd.test_switches import for_process

logger = logging.getLogger(__name__)

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


def after_add_request_to_queue(_result, scheduler, req, is_retracted=False, *a, **kw) -> None:
    rt = runtime(scheduler)
    if rt is None or is_retracted:
        return
    try:
        rt.admit(req)
    except Exception as e:  # this request's problem: it ends with an error, the scheduler goes on
        logger.exception("request %s: sglang-pdd could not take it", req.rid)
        end_queued(req, f"pdd: internal error taking the request: {type(e).__name__}: {e}", status_code=500)


def around_process_decode_queue(original, scheduler, *a, **kw):
    result = original(scheduler, *a, **kw)
    rt = runtime(scheduler)
    if rt is not None:
        rt.after_process_decode_queue()
    return result


def around_get_next_disagg_decode_batch_to_run(original, scheduler, running_batch, *a, **kw):
    rt = runtime(scheduler)
    if rt is None:
        return original(scheduler, running_batch, *a, **kw)
    batch, running_batch = rt.next_batch(running_batch)
    if batch is None:
        return original(scheduler, running_batch, *a, **kw)
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)


def around_process_batch_result(original, scheduler, batch, result, *a, **kw):
    """A catch-up chunk's EXTEND is MainDecode's: it only wrote KV (see MainRuntime.on_batch_result)."""
    rt = getattr(scheduler, "_pdd_runtime", None)
    if rt is not None and rt.on_batch_result(batch, result):
        return None
    return original(scheduler, batch, result, *a, **kw)


def after_is_fully_idle(result, scheduler, *a, **kw):
    rt = runtime(scheduler)
    if result and rt is not None:
        return rt.settle_idle()
    return result


def after_abort_request(_result, scheduler, recv_req, *a, **kw) -> None:
    rt = runtime(scheduler)
    if rt is not None:
        rt.on_abort_request(recv_req.rid, getattr(recv_req, "abort_message", None),
                            abort_all=bool(getattr(recv_req, "abort_all", False)))
