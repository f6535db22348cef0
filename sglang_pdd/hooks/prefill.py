"""Prefill (P) hooks: the fan-out sender and its main lanes.

Active with `--pdd-role prefill` only; on any other server every body calls straight through.
The logic lives in sglang_pdd.transfer (fanout, lanes, mooncake_fanout), the fan-out registry, lanes
and builder in sglang_pdd.process_state.fanout; P's refusal of late registrations is hooks/idle.py's
`around_update_status`, P's pool state for leak checks hooks/server_info.py.

On sglang with patch 0002 `create_sender` is not hooked (plugin.CAPABILITIES): `kv_destinations` is
sglang's KV destinations provider, MD's room a `KVDestination`, and sglang's
`MultiDestinationKVSender` does what `FanoutSender` does here.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from sglang_pdd.process_state import fanout
from sglang_pdd.transfer.mooncake_fanout import FanoutParamsError, refuse_room

logger = logging.getLogger(__name__)


def around_create_sender(original, queue, req, num_kv_heads):
    builder = fanout.builder()
    if builder is None:
        return original(queue, req, num_kv_heads)
    try:
        main_room = _main_room(builder, queue, req)
    except FanoutParamsError as e:
        _reject(queue, req, str(e))
        _refuse_rejected(queue, req, e)
        return False
    ok = original(queue, req, num_kv_heads)
    if ok and main_room is not None:
        try:
            builder.attach(queue, req, main_room)
        except Exception as e:  # the relay's sender stands; only MD's leg of this request is lost
            logger.exception("room %s: no fan-out to main room %s", req.bootstrap_room, main_room)
            fanout.REGISTRY.refuse(main_room)
            refuse_room(queue.kv_manager, main_room, f"the prefill could not fan this request out: {e}")
    return ok


def kv_destinations(queue, req):
    """sglang's KV destinations provider (patch 0002): MD's room, or None for a plain PD request; a
    malformed `pdd` parameter raises (sglang rejects the request with a 400)."""
    builder = fanout.builder()
    if builder is None:
        return None
    try:
        main_room = _main_room(builder, queue, req)
    except FanoutParamsError as e:
        _refuse_rejected(queue, req, e)
        raise
    return None if main_room is None else builder.destinations(req, main_room)


def use_destinations_provider() -> None:
    from sglang.srt.disaggregation.prefill import set_kv_destinations_provider

    set_kv_destinations_provider(kv_destinations)


def _main_room(builder, queue, req) -> int | None:
    main_room = builder.main_room(req)
    if main_room is not None:
        builder.check_room_free(main_room, _rooms_in_flight(queue, req))
    return main_room


def _refuse_rejected(queue, req, error: Exception) -> None:
    """The decodes sent a rejected request are told at once, whether they registered already or later."""
    fanout.REGISTRY.refuse(req.bootstrap_room)
    refuse_room(queue.kv_manager, req.bootstrap_room, f"the prefill rejected the request: {error}")


def _rooms_in_flight(queue, req) -> set:
    """Bootstrap rooms of the other requests in P's bootstrap and in-flight queues."""
    reqs = [*getattr(queue, "queue", ()), *getattr(queue.scheduler, "disagg_prefill_inflight_queue", ())]
    return {r.bootstrap_room for r in reqs if r is not req}


def around_add_transfer_request(original, manager, room, *args, **kwargs):
    if fanout.builder() is None:
        return original(manager, room, *args, **kwargs)
    return fanout.LANES.route(original, manager, room, *args, **kwargs)


def _reject(queue, req, message: str) -> None:
    """End this request with a 400, as sglang does for a prompt over capacity; the server goes on."""
    from sglang.srt.disaggregation.utils import prepare_abort

    logger.warning("request %s (room %s) rejected: %s", req.rid, req.bootstrap_room, message)
    prepare_abort(req, message, status_code=HTTPStatus.BAD_REQUEST)
    queue.scheduler.output_streamer.stream_output([req], req.return_logprob)
