"""Prometheus metrics of all roles, created lazily in the process that first records one.

sglang runs prometheus_client in multiprocess mode when started with `--enable-metrics`
(`PROMETHEUS_MULTIPROC_DIR` set by the launcher before it spawns the schedulers), so a counter
incremented in a scheduler shows on the server's `/metrics`. Creating metrics lazily keeps
prometheus_client from being imported before that variable is set.
"""

from __future__ import annotations

import threading

PREFIX = "sglang_pdd_"
_lock = threading.Lock()
_metrics: dict[str, object] = {}


def _counter(name: str, doc: str, labels: tuple[str, ...]):
    with _lock:
        if name not in _metrics:
            from prometheus_client import Counter

            _metrics[name] = Counter(PREFIX + name, doc, labels)
        return _metrics[name]


def record_transfer(kind: str, peer: str, nbytes: int, ok: bool, path: str = "direct") -> None:
    """One transfer-engine batch; `path` is the PDD leg (relay, main, or direct for plain PD)."""
    labels = ("path", "kind", "peer")
    if ok:
        _counter("transfer_bytes", "Bytes written by the KV transfer engine", labels).labels(
            path, kind, peer).inc(nbytes)
        _counter("transfer_batches", "Completed transfer-engine batches", labels).labels(
            path, kind, peer).inc()
    else:
        _counter("transfer_failed_batches", "Failed transfer-engine batches", labels).labels(
            path, kind, peer).inc()


def parse_exposition(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of metric `name` in a Prometheus text exposition: {sorted label pairs: value}."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric != name:
            continue
        pairs = []
        for part in labels.rstrip("}").split(","):
            if "=" in part:
                k, _, v = part.partition("=")
                pairs.append((k.strip(), v.strip().strip('"')))
        out[tuple(sorted(pairs))] = out.get(tuple(sorted(pairs)), 0.0) + float(value)
    return out
