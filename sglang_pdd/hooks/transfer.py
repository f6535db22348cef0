"""Mooncake transfer engine and KV manager: count the bytes each batch write moves, and what they were."""

from __future__ import annotations

from sglang_pdd import metrics
from sglang_pdd.transfer.accounting import TransferLedger

LEDGER = TransferLedger(on_record=metrics.record_transfer)


def around_batch_transfer_sync(original, engine, session_id, buffers, peer_addresses, lengths, *a, **kw):
    ret = original(engine, session_id, buffers, peer_addresses, lengths, *a, **kw)
    LEDGER.record(str(session_id), int(sum(lengths)), ok=ret is not None and ret >= 0)
    return ret


def around_send_kvcache(original, manager, *a, **kw):
    with LEDGER.kind("kv"):
        return original(manager, *a, **kw)


def around_send_aux(original, manager, *a, **kw):
    with LEDGER.kind("aux"):
        return original(manager, *a, **kw)
