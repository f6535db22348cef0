"""Each peer's load from its own `/metrics`: requests running and queued, KV-pool usage.

The router's own in-flight count is immediate but sees only this router's requests; a server's
gauges (`sglang:num_running_reqs`, the waiting queues, `sglang:token_usage`; servers started with
`--enable-metrics`) see every router's and every queue, a poll interval late. `Peer.load` takes
the larger of the two. A peer whose page cannot be read keeps its last figures. Its scheduler's idle-time
counter (`sglang:scheduler_idle_seconds_total`) gives its recent busy share of time (`Peer.busy`: wall time
less idle time, `policy.busy_fraction`), which the relay placement's headroom rule reads for P.
"""

from __future__ import annotations

import time

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.router.peers import metrics_poll
from sglang_pdd.router.peers.pool import Peer

RUNNING, USAGE = "sglang:num_running_reqs", "sglang:token_usage"
IDLE = "sglang:scheduler_idle_seconds_total"  # the scheduler's idle wall time (every TP rank's: the largest)
WAITING = "sglang:num_queue_reqs"  # waiting for a forward (on P: its prefill queue, the pipeline policy's slack)
# waiting: scheduled, or (PD) holding KV slots while their KV is on its way
QUEUES = ("sglang:num_queue_reqs", "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
          "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs")


def load_of(text: str) -> tuple[float, float] | None:
    """(running + queued requests, KV usage 0..1) in one exposition page; None without sglang's gauges."""
    running = parse_exposition(text, RUNNING)
    if not running:
        return None
    queued = sum(sum(parse_exposition(text, name).values()) for name in QUEUES)
    usage = parse_exposition(text, USAGE)
    return (sum(running.values()) + queued,
            min(max(max(usage.values(), default=0.0), 0.0), 1.0))


def update(peer: Peer, text: str, now_s: float | None = None) -> bool:
    got = load_of(text)
    if got is None:
        return False
    peer.running, peer.kv_usage = got
    peer.waiting = sum(parse_exposition(text, WAITING).values())
    idle = parse_exposition(text, IDLE)
    if idle:  # busy time = wall time - idle time; the estimator takes differences, so any origin will do
        now = time.monotonic() if now_s is None else now_s
        peer.busy.sample(now, now - max(idle.values()))
    return True


async def poll_forever(session, peers: list[Peer], interval_s: float = 1.0) -> None:
    by_url = {p.url: p for p in peers}
    await metrics_poll.poll_forever(session, list(by_url), interval_s, lambda url, text: update(by_url[url], text),
                                    "load feed")
