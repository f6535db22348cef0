"""What a prefill server still holds: its KV pool, request rows, metadata slots and transfer tables.

Read through sglang's `/get_server_info` (`internal_states[i]["pdd_prefill"]`, added by the prefill
hook) so a test can tell that P is back to idle after fan-outs, aborts and timeouts: no KV page, row
or metadata slot held, no room left in the Mooncake manager's tables. `is_idle(state)` is that check.
"""

from __future__ import annotations

from typing import Any

KEY = "pdd_prefill"
_TABLES = ("request_status", "transfer_infos", "req_to_decode_prefix_len", "failure_records",
           "_staging_outstanding")


def rows_total(rows: Any) -> int:
    """Request rows a pool can hand out, all free when idle. A decode server's pool
    (DecodeReqToTokenPool) has `pre_alloc_size` rows beyond `size` for requests whose KV is still on
    its way: `size` 8 and 16 more on the test servers, so 24 are free when idle, not 8."""
    return int(rows.size) + int(getattr(rows, "pre_alloc_size", 0) or 0)


def free_kv(scheduler: Any) -> int:
    """KV slots a scheduler can hand out now: free, or held only by its radix cache (evictable)."""
    return int(scheduler.token_to_kv_pool_allocator.available_size()) + int(scheduler.tree_cache.evictable_size())


def kv_usage(scheduler: Any) -> float:
    """The share of a scheduler's KV pool not free to hand out (0..1)."""
    return min(1.0, max(0.0, 1.0 - free_kv(scheduler) / max(1, int(scheduler.max_total_num_tokens))))


def pool_counts(scheduler: Any) -> dict[str, int]:
    """A scheduler's KV slots (total, available, evictable, protected) and request rows (free, total)."""
    return {
        "kv_total": int(scheduler.max_total_num_tokens),
        "kv_available": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "kv_evictable": int(scheduler.tree_cache.evictable_size()),
        "kv_protected": int(scheduler.tree_cache.protected_size()),
        "req_rows_free": int(scheduler.req_to_token_pool.available_size()),
        "req_rows_total": rows_total(scheduler.req_to_token_pool),
    }


def prefill_pool_state(scheduler: Any) -> dict:
    queue = scheduler.disagg_prefill_bootstrap_queue
    kv_mgr = queue.kv_manager
    meta = queue.req_to_metadata_buffer_idx_allocator
    return {
        **pool_counts(scheduler),
        "metadata_free": int(meta.available_size()),
        "metadata_total": int(meta.size),
        "bootstrap_queue": len(queue.queue),
        "inflight_queue": len(scheduler.disagg_prefill_inflight_queue),
        "rooms": {name: len(getattr(kv_mgr, name, {}) or {}) for name in _TABLES},
    }


def idle_problems(state: dict) -> list[str]:
    """Why `state` is not an idle prefill (empty when it is)."""
    out = []
    if state["kv_available"] + state["kv_evictable"] != state["kv_total"]:
        out.append(f"KV pages held: available {state['kv_available']} + evictable {state['kv_evictable']} "
                   f"!= total {state['kv_total']}")
    if state["kv_protected"]:
        out.append(f"{state['kv_protected']} KV tokens locked in the radix cache")
    for free, total in (("req_rows_free", "req_rows_total"), ("metadata_free", "metadata_total")):
        if state[free] != state[total]:
            out.append(f"{free} {state[free]} != {state[total]}")
    for q in ("bootstrap_queue", "inflight_queue"):
        if state[q]:
            out.append(f"{q} holds {state[q]} requests")
    out += [f"kv manager {name} holds {n} rooms" for name, n in state["rooms"].items() if n]
    out += [f"its local relay holds {n} {what}" for what, n in state.get("local_relay", {}).items() if n]
    return out
