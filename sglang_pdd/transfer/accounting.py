"""Byte accounting of KV transfers, counted where the bytes move: the transfer engine's batch writes.

A `TransferLedger` keeps, per (kind, peer), the bytes and batches that completed and the batches that
failed. `kind` says what the bytes were ("kv", "aux", or "other"); callers higher up set it for the
current thread with `ledger.kind("kv")`, since the engine call itself cannot tell. Every record is
also exported as Prometheus counters (see sglang_pdd.server.metrics), so `/metrics` of a server shows them.

Each record also has a `path`: which leg of PDD the bytes took. A thread that only moves one path's
bytes sets it for its lifetime (`ledger.path("main")`: the fan-out's main lanes); otherwise the peer
session decides (`tag_sessions(sessions, "relay")`: the fan-out's relay receivers), and bytes to any
other peer are "direct" (plain PD). Totals per (path, kind) come from `path_totals()`.
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


DIRECT_PATH = "direct"


class TransferLedger:
    def __init__(self, on_record: Callable[..., None] | None = None):
        """`on_record(kind, peer, nbytes, ok, path=path)` is called for every record."""
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], PathTotals] = defaultdict(PathTotals)
        self._path_totals: dict[tuple[str, str], PathTotals] = defaultdict(PathTotals)
        self._session_paths: dict[str, str] = {}
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

    @contextlib.contextmanager
    def path(self, path: str) -> Iterator[None]:
        prev = getattr(self._local, "path", None)
        self._local.path = path
        try:
            yield
        finally:
            self._local.path = prev

    def current_path(self, peer: str | None = None) -> str:
        return (getattr(self._local, "path", None) or (self._session_paths.get(peer) if peer else None)
                or DIRECT_PATH)

    def tag_sessions(self, sessions, path: str) -> None:
        """Bytes to these peer sessions belong to `path` (unless the writing thread says otherwise)."""
        with self._lock:
            for s in sessions:
                self._session_paths[str(s)] = path

    def record(self, peer: str, nbytes: int, ok: bool) -> None:
        kind = self.current_kind()
        path = self.current_path(peer)
        with self._lock:
            for t in (self._totals[(kind, peer)], self._path_totals[(path, kind)]):
                if ok:
                    t.bytes += nbytes
                    t.batches += 1
                else:
                    t.failed_batches += 1
        if self._on_record is not None:
            self._on_record(kind, peer, nbytes, ok, path=path)

    def snapshot(self) -> dict[tuple[str, str], PathTotals]:
        with self._lock:
            return {k: PathTotals(**vars(v)) for k, v in self._totals.items()}

    def path_totals(self) -> dict[tuple[str, str], PathTotals]:
        """Totals per (path, kind)."""
        with self._lock:
            return {k: PathTotals(**vars(v)) for k, v in self._path_totals.items()}

    def total_bytes(self, kind: str | None = None) -> int:
        return sum(t.bytes for (k, _), t in self.snapshot().items() if kind is None or k == kind)
