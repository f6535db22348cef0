"""Decode scheduler hooks shared by RelayDecode and MainDecode; each delegates to its role's runtime.

Without a PDD role (or on prefill) every body returns at once and sglang runs unchanged.

On sglang with patch 0003 none of these six is registered (plugin.CAPABILITIES): `use_decode_extension`
makes sglang's decode scheduler call the same runtime through its extension point
(sglang_pdd.decode.extension), at the same six places.
"""

from __future__ import annotations

from sglang_pdd.decode import extension as decode_extension
from sglang_pdd.decode.runtime import current, runtime


def use_decode_extension() -> None:
    """Patch 0003's extension point: sglang creates our extension with each decode scheduler."""
    from sglang.srt.disaggregation.decode_extension import set_decode_scheduler_extension

    set_decode_scheduler_extension(decode_extension.create)


def after_add_request_to_queue(_result, scheduler, req, is_retracted=False, *a, **kw) -> None:
    rt = runtime(scheduler)
    if rt is not None and not is_retracted:
        rt.take_request(req)


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

    batch = scheduler.dp_attn_adapter.maybe_prepare_mlp_sync_batch(batch)  # as sglang does with patch 0003
    return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)


def around_process_batch_result(original, scheduler, batch, result, *a, **kw):
    """A catch-up chunk's EXTEND is MainDecode's: it only wrote KV (see MainRuntime.on_batch_result)."""
    rt = current(scheduler)
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
        rt.after_abort_request(recv_req)
