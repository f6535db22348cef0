"""The process's transfer ledger: bytes of every Mooncake batch write, by kind (kv/aux) and path."""

from __future__ import annotations

from sglang_pdd.server import metrics
from sglang_pdd.transfer.accounting import TransferLedger

LEDGER = TransferLedger(on_record=metrics.record_transfer)
