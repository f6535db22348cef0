"""`/get_server_info` of a PDD server (`internal_states[i]`): which path the plugin took per capability
of patches/ (every role, process_state.capabilities), which entry serves RLD's or MD's decode runtime
(decode_extension.path: sglang's decode scheduler extension or the hooks), and P's pool state for
leak checks (transfer.pool_state). Inert on a server without `--pdd-role`."""

from __future__ import annotations

import functools

from sglang_pdd.decode import extension as decode_extension
from sglang_pdd.config import PddConfig
from sglang_pdd.prefill_relay.runtime import relay
from sglang_pdd.process_state import capabilities, fanout
from sglang_pdd.transfer import pool_state


@functools.lru_cache(maxsize=1)
def _active() -> bool:
    return PddConfig.from_env().active


def after_get_internal_state(result, controller, *args, **kwargs):
    state = getattr(result, "internal_state", None)
    if not isinstance(state, dict):
        return result
    if _active():
        state[capabilities.KEY] = dict(capabilities.CHOSEN)
        decode_path = decode_extension.path(controller.scheduler)
        if decode_path is not None:
            state[decode_extension.KEY] = decode_path
    if fanout.builder() is not None:
        state[pool_state.KEY] = pool_state.prefill_pool_state(controller.scheduler)
        local = relay(controller.scheduler)
        if local is not None:
            state[pool_state.KEY]["local_relay"] = local.state()
    return result
