"""Mooncake transfer engine and KV manager: count the bytes each batch write moves, and what they were;
with `--pdd-transfer-poll-ms` (on for PDD roles), wait for each write with sleeps instead of Mooncake's
spin (sglang_pdd.transfer.write_wait).

Before each KV write, the process's transfer controls see its path (transfer/controls.py: nothing in
production; the test-only knob `main_write_delay` sleeps on the fan-out's main path, a slow WAN write).
"""

from __future__ import annotations

import time

from sglang_pdd.server import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.process_state import packed_wan
from sglang_pdd.process_state.transfer_ledger import LEDGER
from sglang_pdd.transfer import controls, write_wait

_UNSET = object()
_poll_s = _UNSET


def transfer_poll_s() -> float:
    """The configured longest sleep between a write's status checks (0: Mooncake's sync spin)."""
    global _poll_s
    if _poll_s is _UNSET:
        _poll_s = PddConfig.from_env().transfer_poll_s
    return _poll_s


def around_batch_transfer_sync(original, engine, session_id, buffers, peer_addresses, lengths, *a, **kw):
    t0 = time.perf_counter()
    poll_s = transfer_poll_s()
    binding = getattr(engine, "engine", None)
    if poll_s > 0 and not a and not kw and write_wait.supported(binding):
        ret = write_wait.write(binding, session_id, buffers, peer_addresses, lengths, poll_s)
    else:
        ret = original(engine, session_id, buffers, peer_addresses, lengths, *a, **kw)
    ok = ret is not None and ret >= 0
    LEDGER.record(str(session_id), int(sum(lengths)), ok=ok)
    if ok:  # the router's bandwidth estimate is fed from bytes / seconds of completed writes
        metrics.record_transfer_seconds(LEDGER.current_kind(), LEDGER.current_path(str(session_id)),
                                        time.perf_counter() - t0, slices=len(lengths), peer=str(session_id))
    return ret


def around_send_kvcache(original, manager, session_id, prefill_pages, dst_ptrs, dst_pages, *a, **kw):
    """One chunk's KV to one decode: packed into MD's landing region when it offered one (see
    process_state/packed_wan.py), else page by page as sglang does."""
    controls.for_process().before_kv_write(LEDGER.current_path())
    with LEDGER.kind("kv"):
        ret = packed_wan.send_kvcache(manager, session_id, prefill_pages, dst_pages, **kw)
        if ret is not None:
            return ret
        return original(manager, session_id, prefill_pages, dst_ptrs, dst_pages, *a, **kw)


def around_send_aux(original, manager, *a, **kw):
    with LEDGER.kind("aux"):
        return original(manager, *a, **kw)
