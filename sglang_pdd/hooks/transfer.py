"""Mooncake transfer engine and KV manager: count the bytes each batch write moves, and what they were.

The test-only `SGLANG_PDD_TEST_MAIN_WRITE_DELAY` (config.main_write_delay_for_tests) makes every KV
write on the fan-out's main path sleep first, emulating a slow WAN write; 0 (unset) in production.
"""

from __future__ import annotations

import functools
import time

from sglang_pdd import config, metrics
from sglang_pdd.transfer.accounting import TransferLedger
from sglang_pdd.transfer.lanes import MAIN_PATH

LEDGER = TransferLedger(on_record=metrics.record_transfer)


@functools.lru_cache(maxsize=1)
def _main_write_delay() -> float:
    return config.main_write_delay_for_tests()


def around_batch_transfer_sync(original, engine, session_id, buffers, peer_addresses, lengths, *a, **kw):
    ret = original(engine, session_id, buffers, peer_addresses, lengths, *a, **kw)
    LEDGER.record(str(session_id), int(sum(lengths)), ok=ret is not None and ret >= 0)
    return ret


def around_send_kvcache(original, manager, *a, **kw):
    if LEDGER.current_path() == MAIN_PATH and _main_write_delay() > 0:
        time.sleep(_main_write_delay())
    with LEDGER.kind("kv"):
        return original(manager, *a, **kw)


def around_send_aux(original, manager, *a, **kw):
    with LEDGER.kind("aux"):
        return original(manager, *a, **kw)
