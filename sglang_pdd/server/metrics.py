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
            from prometheus_client import Counter  # lazily: see the module docstring

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


def record_transfer_seconds(kind: str, path: str, seconds: float, slices: int = 0, peer: str = "") -> None:
    """Wall time and slices of one completed transfer-engine batch (bytes in `transfer_bytes`).

    Slices per batch are what makes a high-RTT link round-trip bound: page by page a chunk is one
    slice per contiguous page run, layer and K/V; packed, one per block plus its table entry."""
    labels = ("path", "kind", "peer")  # peer: the destination's transfer-engine session (host:port)
    _counter("transfer_seconds", "Seconds spent in completed transfer-engine batches",
             labels).labels(path, kind, peer).inc(seconds)
    if slices:
        _counter("transfer_slices", "Slices (one source/destination range each) of completed "
                 "transfer-engine batches", labels).labels(path, kind, peer).inc(slices)


def parse_exposition(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of metric `name` (a sample name: `x_total`, `x_bucket`, `sglang:token_usage`) in a
    Prometheus text exposition: {sorted label pairs: value}, summed over samples with equal labels.

    prometheus_client's parser reads the samples (escaped quotes, commas and braces in label values,
    timestamps); it is handed only the lines that can be samples of `name` (the exposition format is
    one sample a line, a newline in a label value is escaped), so a poll costs what the series costs,
    not what the whole page costs. A malformed sample line raises ValueError."""
    from prometheus_client.parser import text_string_to_metric_families

    # split on "\n" only: str.splitlines() would also split on a U+2028 inside a label value
    lines = [line for line in text.split("\n")
             if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ", "\t")]
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == name:
                key = tuple(sorted(sample.labels.items()))
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def _gauge(name: str, doc: str, labels: tuple[str, ...]):
    with _lock:
        if name not in _metrics:
            from prometheus_client import Gauge

            _metrics[name] = Gauge(PREFIX + name, doc, labels, multiprocess_mode="livesum")
        return _metrics[name]


def set_lane_queued(path: str, peer: str, nbytes: int) -> None:
    """KV bytes queued on P's lane to `peer` (its receiver session host:port), not yet written."""
    _gauge("lane_queued_bytes", "KV bytes queued on a transfer lane, not yet written", ("path", "peer")).labels(
        path, peer).set(nbytes)


def record_handoff(role: str, handoff_tokens: int) -> None:
    """One handoff of `handoff_tokens` eager tokens (counted on the relay and on the main side)."""
    _counter("handoffs", "Extend-decode handoffs", ("role",)).labels(role).inc()
    _counter("handoff_tokens", "Eager tokens handed over", ("role",)).labels(role).inc(handoff_tokens)


def record_local_relay(event: str) -> None:
    """A prefill that relays (--pdd-relay local): a relayed request `decoding` on P, `parked` at once for lack
    of KV (hands MD its first token), `finished_at_prefill` (its first token ended it), `aborted` (its client
    left), `refused_unsigned` (served P->MD), or its `transfer_failed`."""
    _counter("local_relay_requests", "Requests relayed to a prefill that relays, by what it did with them",
             ("event",)).labels(event).inc()


def record_extend_batch(size: int) -> None:
    _counter("handoff_extend_batches", "Handoff EXTEND batches run on MainDecode, by batch size",
             ("size",)).labels(str(size)).inc()


def record_relay_finished(role: str, n: int = 1) -> None:
    _counter("relay_finished", "Relayed requests the relay completed itself", ("role",)).labels(role).inc(n)


def record_handoff_failure(role: str, reason: str) -> None:
    _counter("handoff_failures", "Relayed requests that ended with an error", ("role", "reason")).labels(
        role, reason).inc()


def record_channel_rejects(role: str, reason: str, n: int) -> None:
    _counter("token_channel_rejected", "Token-channel frames dropped (bad MAC, version, malformed...)",
             ("role", "reason")).labels(role, reason).inc(n)


def set_held(role: str, n: int) -> None:
    _gauge("handoff_held_requests", "Relayed requests waiting for their handoff", ("role",)).labels(role).set(n)


def set_handoff_requests(role: str, by_state: dict[str, int]) -> None:
    """Entries of a role's handoff table by state: a leak shows as a state that never drains."""
    g = _gauge("handoff_requests", "Relayed requests in the handoff table, by state", ("role", "state"))
    for state, n in by_state.items():
        g.labels(role, state).set(n)


def publish_pool_state(role: str, counts: dict[str, int]) -> None:
    """KV slots and request rows of a scheduler (`transfer.pool_state.pool_counts`), so tests and
    operators can see leaks from outside."""
    g = _gauge("kv_pool_tokens", "KV pool slots by state", ("role", "state"))
    for state in ("available", "evictable", "protected", "total"):
        g.labels(role, state).set(counts[f"kv_{state}"])
    r = _gauge("req_rows", "Request rows (req_to_token) by state", ("role", "state"))
    r.labels(role, "free").set(counts["req_rows_free"])
    r.labels(role, "total").set(counts["req_rows_total"])


def record_handoff_mode(role: str, mode: str, reason: str, n: int = 1) -> None:
    """Handoff modes fixed for requests (on RLD, which decides) and why (a short label)."""
    _counter("handoff_mode", "Handoffs by mode (one-shot, catch-up) and the reason of the choice",
             ("role", "mode", "reason")).labels(role, mode, reason).inc(n)


_CATCHUP = {"chunks": ("catchup_chunks", "Non-final catch-up chunks"),
            "tokens": ("catchup_chunk_tokens", "Eager tokens sent or recomputed in non-final catch-up chunks")}


def record_catchup(role: str, what: str, n: int) -> None:
    """`n` more non-final catch-up chunks (`what="chunks"`) or eager tokens they carried ("tokens")."""
    name, doc = _CATCHUP[what]
    _counter(name, doc, ("role",)).labels(role).inc(n)


def set_handoff_policy_inputs(rld_running: int, rld_kv_usage: float, md_batch: int) -> None:
    """The inputs of RLD's last adaptive handoff choice."""
    g = _gauge("handoff_policy_input", "Inputs of the last adaptive handoff-mode choice", ("input",))
    g.labels("rld_running").set(rld_running)
    g.labels("rld_kv_usage").set(rld_kv_usage)
    g.labels("md_batch").set(md_batch)


def record_handoff_attention(path: str, reason: str) -> None:
    """One handoff EXTEND on MainDecode: its attention ran the handoff kernel (`kernel`), sglang's backend
    (`sglang`, with the first reason) or both (`mixed`, some layers refused)."""
    _counter("handoff_attention_batches", "Handoff EXTEND batches by attention path", ("path", "reason")).labels(
        path, reason).inc()


def record_packed_wan(side: str, event: str) -> None:
    """Packed WAN path: P's chunks packed or sent page by page (and why); MD's offers and unpacks."""
    _counter("packed_wan_events", "Packed WAN path events by side and event", ("side", "event")).labels(
        side=side, event=event).inc()


def set_packed_wan_landing(used_bytes: int, rooms: int, quarantined: int) -> None:
    g = _gauge("packed_wan_landing", "MainDecode's packed-WAN landing arena", ("what",))
    g.labels(what="bytes").set(used_bytes)
    g.labels(what="rooms").set(rooms)
    g.labels(what="quarantined").set(quarantined)
