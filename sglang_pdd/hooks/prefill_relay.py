"""Hooks of a prefill that relays (`--pdd-relay local`): each delegates to its LocalRelay
(sglang_pdd.prefill_relay.local_relay); on any other server every body calls straight through."""

from __future__ import annotations

from sglang_pdd.prefill_relay.local_relay import keep_max_new_tokens
from sglang_pdd.prefill_relay.runtime import relay


def around_process_req(original, queue, req, *a, **kw):
    """sglang's prefill queue sets every request's max_new_tokens to 1; a relaying P keeps the request's own."""
    if relay(queue.scheduler) is not None:
        keep_max_new_tokens(req)
    return original(queue, req, *a, **kw)


def around_get_next_disagg_prefill_batch_to_run(original, scheduler, *a, **kw):
    lr = relay(scheduler)
    if lr is None:
        return original(scheduler, *a, **kw)
    running_batch = kw.pop("running_batch") if "running_batch" in kw else a[0]
    last_batch = kw.pop("last_batch") if "last_batch" in kw else (a[1] if len(a) > 1 else None)
    return lr.next_plan(original, running_batch, last_batch, *a[2:], **kw)


def around_process_batch_result_disagg_prefill(original, scheduler, batch, result, *a, **kw):
    lr = relay(scheduler)
    if lr is None:
        return original(scheduler, batch, result, *a, **kw)
    before = {id(r) for r in scheduler.disagg_prefill_inflight_queue}
    out = original(scheduler, batch, result, *a, **kw)
    lr.take_prefilled([r for r in scheduler.disagg_prefill_inflight_queue if id(r) not in before])
    return out


def around_process_disagg_prefill_inflight_queue(original, scheduler, *a, **kw):
    lr = relay(scheduler)
    if lr is None:
        return original(scheduler, *a, **kw)
    return lr.poll_transfers(original, *a, **kw)


def after_abort_request(_result, scheduler, recv_req, *a, **kw) -> None:
    lr = relay(scheduler)
    if lr is not None:
        lr.on_abort(recv_req.rid, abort_all=bool(getattr(recv_req, "abort_all", False)))


def after_is_fully_idle(result, scheduler, *a, **kw):
    """Not idle while the relay holds requests or rows (sglang checks its pools for leaks when idle); a health
    check is answered as sglang decides."""
    if not result or kw.get("for_health_check", a[0] if a else False):
        return result
    lr = relay(scheduler)
    return not (lr is not None and lr.holds())
