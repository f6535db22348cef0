"""Decode scheduler hooks shared by RelayDecode and MainDecode; each delegates to its role's runtime.

Without a PDD role (or on prefill) every body returns at once and sglang runs unchanged.
"""

from __future__ import annotations

import logging
import time

from sglang_pdd import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.main.handoff_attention import ATTENTION
from sglang_pdd.request_errors import end_queued
from sglang_pdd.roles import Role

logger = logging.getLogger(__name__)

_UNSET = object()
PUBLISH_EVERY_S = 0.25


def runtime(scheduler):
    """The scheduler's RelayRuntime / MainRuntime, created on first use; None when inert."""
    rt = getattr(scheduler, "_pdd_runtime", _UNSET)
    if rt is not _UNSET:
        return rt
    rt = None
    cfg = PddConfig.from_env()
    if cfg.role in (Role.RELAY, Role.MAIN) and getattr(scheduler, "attn_tp_rank", 0) == 0:
        secret = cfg.secret()
        if cfg.role is Role.RELAY:
            from sglang_pdd.relay.runtime import RelayRuntime

            rt = RelayRuntime(scheduler, cfg, secret)
        else:
            from sglang_pdd.main.runtime import MainRuntime

            rt = MainRuntime(scheduler, cfg, secret)
            ATTENTION.warm_up(scheduler)
    scheduler._pdd_runtime = rt
    return rt


def after_add_request_to_queue(_result, scheduler, req, is_retracted=False, *a, **kw) -> None:
    rt = runtime(scheduler)
    if rt is None or is_retracted:
        return
    try:
        if hasattr(rt, "admit"):
            rt.admit(req)
        else:
            rt.track(req)
    except Exception as e:  # this request's problem: it ends with an error, the scheduler goes on
        logger.exception("request %s: sglang-pdd could not take it", req.rid)
        end_queued(req, f"pdd: internal error taking the request: {type(e).__name__}: {e}", status_code=500)


def around_process_decode_queue(original, scheduler, *a, **kw):
    result = original(scheduler, *a, **kw)
    rt = runtime(scheduler)
    if rt is None:
        return result
    if hasattr(rt, "after_process_decode_queue"):
        rt.after_process_decode_queue()
    else:
        rt.poll()
    now = rt._active_at = time.monotonic()
    if now - getattr(rt, "_published_at", 0.0) >= PUBLISH_EVERY_S:  # the loop can spin: gauges are not free
        _publish(rt, scheduler, now)
    return result


def _publish(rt, scheduler, now: float) -> None:
    rt._published_at = now
    role = "main" if hasattr(rt, "after_process_decode_queue") else "relay"
    metrics.publish_pool_state(role, scheduler)
    if role == "main":
        rt.publish()


def around_get_next_disagg_decode_batch_to_run(original, scheduler, running_batch, *a, **kw):
    rt = runtime(scheduler)
    if rt is None or not hasattr(rt, "next_batch"):
        return original(scheduler, running_batch, *a, **kw)
    ATTENTION.disarm()  # last round's handoff batch has run
    batch, running_batch = rt.next_batch(running_batch)
    if batch is None:
        return original(scheduler, running_batch, *a, **kw)
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    batch = scheduler.dp_attn_adapter.maybe_prepare_mlp_sync_batch(batch)
    ATTENTION.arm(batch, batch.batch_size())  # its attention may take the handoff kernel
    return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)


def around_process_batch_result(original, scheduler, batch, result, *a, **kw):
    """A catch-up chunk's EXTEND is MainDecode's: it only wrote KV (see MainRuntime.on_chunk_result)."""
    rt = getattr(scheduler, "_pdd_runtime", None)
    if rt is not None and hasattr(rt, "next_batch"):
        ATTENTION.disarm(batch)
    if rt is not None and hasattr(rt, "owns") and rt.owns(batch):
        return rt.on_chunk_result(batch, result)
    return original(scheduler, batch, result, *a, **kw)


def after_is_fully_idle(result, scheduler, *a, **kw):
    rt = runtime(scheduler)
    if result and rt is not None and hasattr(rt, "busy") and rt.busy():
        return False
    if result and rt is not None and getattr(rt, "_published_at", 0.0) < getattr(rt, "_active_at", 0.0):
        _publish(rt, scheduler, time.monotonic())  # going idle: the gauges show the final state, not one 0.25 s old
    return result


def after_abort_request(_result, scheduler, recv_req, *a, **kw) -> None:
    rt = runtime(scheduler)
    if rt is not None and hasattr(rt, "on_abort_request"):
        rt.on_abort_request(recv_req.rid, getattr(recv_req, "abort_message", None),
                            abort_all=bool(getattr(recv_req, "abort_all", False)))
