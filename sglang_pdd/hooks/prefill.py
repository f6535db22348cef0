"""Prefill (P) hooks: the fan-out sender, its main lanes, and P's pool state for leak checks.

Active with `--pdd-role prefill` only; on any other server every body calls straight through.
The logic lives in sglang_pdd.transfer (fanout, lanes, mooncake_fanout, pool_state).
"""

from __future__ import annotations

import functools
import logging
from http import HTTPStatus

from sglang_pdd import test_switches
from sglang_pdd.config import PddConfig
from sglang_pdd.hooks.transfer import LEDGER
from sglang_pdd.roles import Role
from sglang_pdd.transfer import pool_state
from sglang_pdd.transfer.lanes import MAIN_PATH, RELAY_PATH, FanoutRegistry, MainLanes
from sglang_pdd.transfer.fanout import Poll
from sglang_pdd.transfer.mooncake_fanout import REFUSED_REASON, FanoutBuilder, FanoutParamsError, refuse_room

logger = logging.getLogger(__name__)

REGISTRY = FanoutRegistry()
LANES = MainLanes(REGISTRY, thread_context=lambda: LEDGER.path(MAIN_PATH),
                  on_relay_sessions=lambda sessions: LEDGER.tag_sessions(sessions, RELAY_PATH))


@functools.lru_cache(maxsize=1)
def _builder() -> FanoutBuilder | None:
    cfg = PddConfig.from_env()
    if cfg.role is not Role.PREFILL:
        return None
    return FanoutBuilder(REGISTRY, cfg.main_bootstrap_timeout, switches=test_switches.for_process())


def around_create_sender(original, queue, req, num_kv_heads):
    builder = _builder()
    if builder is None:
        return original(queue, req, num_kv_heads)
    try:
        main_room = builder.main_room(req)
        if main_room is not None:
            builder.check_room_free(main_room, _rooms_in_flight(queue, req))
    except FanoutParamsError as e:
        _reject(queue, req, str(e))
        # The decodes sent this request are told at once, whether they registered already or later.
        REGISTRY.refuse(req.bootstrap_room)
        refuse_room(queue.kv_manager, req.bootstrap_room, f"the prefill rejected the request: {e}")
        return False
    ok = original(queue, req, num_kv_heads)
    if ok and main_room is not None:
        try:
            builder.attach(queue, req, main_room)
        except Exception as e:  # the relay's sender stands; only MD's leg of this request is lost
            logger.exception("room %s: no fan-out to main room %s", req.bootstrap_room, main_room)
            REGISTRY.refuse(main_room)
            refuse_room(queue.kv_manager, main_room, f"the prefill could not fan this request out: {e}")
    return ok


def _rooms_in_flight(queue, req) -> set:
    """Bootstrap rooms of the other requests in P's bootstrap and in-flight queues."""
    reqs = [*getattr(queue, "queue", ()), *getattr(queue.scheduler, "disagg_prefill_inflight_queue", ())]
    return {r.bootstrap_room for r in reqs if r is not req}


def around_add_transfer_request(original, manager, room, *args, **kwargs):
    if _builder() is None:
        return original(manager, room, *args, **kwargs)
    return LANES.route(original, manager, room, *args, **kwargs)


def around_update_status(original, manager, room, status, *args, **kwargs):
    if (status == Poll.WaitingForInput and _builder() is not None and room not in manager.request_status
            and REGISTRY.refuses(room)):
        return refuse_room(manager, room, REFUSED_REASON)
    return original(manager, room, status, *args, **kwargs)


def after_get_internal_state(result, controller, *args, **kwargs):
    if _builder() is not None and isinstance(getattr(result, "internal_state", None), dict):
        result.internal_state[pool_state.KEY] = pool_state.prefill_pool_state(controller.scheduler)
    return result


def _reject(queue, req, message: str) -> None:
    """End this request with a 400, as sglang does for a prompt over capacity; the server goes on."""
    from sglang.srt.disaggregation.utils import prepare_abort

    logger.warning("request %s (room %s) rejected: %s", req.rid, req.bootstrap_room, message)
    prepare_abort(req, message, status_code=HTTPStatus.BAD_REQUEST)
    queue.scheduler.output_streamer.stream_output([req], req.return_logprob)
