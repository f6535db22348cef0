"""Replay a workload trace against one system: sessions in parallel, turns closed-loop.

Each session is one thread. Its first measured turn is sent at the turn's `arrival_s` (the Poisson
session start); every later turn `think_s` after the previous one completed, with the previous
turns' *real* output token IDs in its prompt (as an agent resends its history). So every system
sees the same prompts as long as it produces the same greedy outputs. Warm-ups (the context each
session had before the window) are sent one by one before the window and not measured.

A session's thread starts at its first turn's arrival (the replaying thread sleeps until then), so
the threads alive are the sessions in progress, not the whole trace (a recorded trace has one session
per request). Call `replay`/`warm_up` from a thread inside the client's cluster: the threads it starts
inherit that network namespace.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import defaultdict
from typing import Callable, Protocol, Sequence

from sglang_pdd.lab.bench.client import StreamResult, greedy_request
from sglang_pdd.lab.bench.metrics import RequestRecord
from sglang_pdd.lab.workload.request import WorkloadRequest
from sglang_pdd.protocol.reply import ReplyMeta

logger = logging.getLogger(__name__)

Send = Callable[[dict, float], StreamResult]


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True) -> Progress:
    """A tqdm bar on stderr (a no-op when disabled or tqdm is missing)."""
    if not enabled:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=True, dynamic_ncols=True)


def sessions(reqs: Sequence[WorkloadRequest]) -> dict[int, list[WorkloadRequest]]:
    """Measured turns per session, in turn order (warm-ups left out)."""
    by: dict[int, list[WorkloadRequest]] = defaultdict(list)
    for r in reqs:
        if not r.warmup:
            by[r.session_id].append(r)
    return {s: sorted(v, key=lambda r: r.turn) for s, v in sorted(by.items())}


def warm_up(send: Send, reqs: Sequence[WorkloadRequest], vocab_size: int, timeout_s: float) -> int:
    """Send the warm-ups one by one; returns how many failed."""
    failed = 0
    for r in reqs:
        if not r.warmup:
            continue
        res = send(greedy_request(r.token_ids(vocab_size), r.max_output_tokens), timeout_s)
        if not res.ok:
            failed += 1
            logger.warning("warm-up %s failed: %s", r.request_id, res.error)
    return failed


def replay(send: Send, reqs: Sequence[WorkloadRequest], vocab_size: int, timeout_s: float,
           progress: Progress | None = None) -> list[RequestRecord]:
    """Run the measured turns; records in trace order. Times are relative to the window start."""
    progress = progress or _NoProgress()
    records: list[RequestRecord] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def run_session(turns: list[WorkloadRequest]) -> None:
        outputs: dict[int, list[int]] = {}
        for i, r in enumerate(turns):
            if i == 0:
                time.sleep(max(0.0, t0 + r.arrival_s - time.monotonic()))
            else:
                time.sleep(r.think_s)
            body = greedy_request(r.token_ids(vocab_size, outputs), r.max_output_tokens)
            sent = time.monotonic() - t0
            res = send(body, timeout_s)
            if res.ok:
                outputs[r.turn] = res.output_ids
            else:
                logger.warning("%s failed: %s", r.request_id, res.error)
            pdd = res.pdd or ReplyMeta()  # every field empty for other systems
            rec = RequestRecord(
                request_id=r.request_id, session_id=r.session_id, turn=r.turn, input_len=r.input_len,
                hit_rate=r.hit_rate, sent_s=sent, ok=res.ok, ttft_s=res.ttft_s, e2e_s=res.e2e_s,
                tpot_s=res.tpot_s, prompt_tokens=res.prompt_tokens, output_tokens=res.output_tokens,
                cached_tokens=res.cached_tokens, error=res.error, pipeline=res.pipeline,
                handoff_tokens=res.handoff_tokens, handoff_mode=pdd.handoff_mode or "",
                md_hit=pdd.md_hit, missed_bytes=pdd.missed_bytes,
                rld_in_flight=pdd.rld_in_flight, route_reason=pdd.reason)
            with lock:
                records.append(rec)
                progress.update(1)

    threads = []
    for sid, turns in sorted(sessions(reqs).items(), key=lambda kv: (kv[1][0].arrival_s, kv[0])):
        time.sleep(max(0.0, t0 + turns[0].arrival_s - time.monotonic()))
        t = threading.Thread(target=run_session, args=(turns,), name=f"session-{sid}", daemon=True)
        t.start()
        threads.append(t)
        threads = [t for t in threads if t.is_alive()]
    for t in threads:
        t.join()
    progress.close()
    order = {r.request_id: i for i, r in enumerate(reqs)}
    return sorted(records, key=lambda rec: order.get(rec.request_id, 0))
