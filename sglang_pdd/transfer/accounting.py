"""Byte accounting of KV transfers, counted where the bytes move: the transfer engine's batch writes.

A `TransferLedger` keeps, per (kind, peer), the bytes and batches that completed and the batches that
failed. `kind` says what the bytes were ("kv", "aux", or "other"); callers higher up set it for the
current thread with `ledger.kind("kv")`, since the engine call itself cannot tell. Every record is
also exported as Prometheus counters (see sglang_pdd.metrics), so `/metrics` of a server shows them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass
class PathTotals:
    bytes: int = 0
    batches: int = 0
    failed_batches: int = 0


class TransferLedger:
    def __init__(self, on_record: Callable[[str, str, int, bool], None] | None = None):
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], PathTotals] = defaultdict(PathTotals)
        self._local = threading.local()
        self._on_record = on_record

    @contextlib.contextmanager
    def kind(self, kind: str) -> Iterator[None]:
        prev = getattr(self._local, "kind", None)
        self._local.kind = kind
        try:
            yield
        finally:
            self._local.kind = prev

    def current_kind(self) -> str:
        return getattr(self._local, "kind", None) or "other"

    def record(self, peer: str, nbytes: int, ok: bool) -> None:
        kind = self.current_kind()
        with self._lock:
            t = self._totals[(kind, peer)]
            if ok:
                t.bytes += nbytes
                t.batches += 1
            else:
                t.failed_batches += 1
        if self._on_record is not None:
            self._on_record(kind, peer, nbytes, ok)

    def snapshot(self) -> dict[tuple[str, str], PathTotals]:
        with self._lock:
            return {k: PathTotals(**vars(v)) for k, v in self._totals.items()}

    def total_bytes(self, kind: str | None = None) -> int:
        return sum(t.bytes for (k, _), t in self.snapshot().items() if kind is None or k == kind)
