"""Each peer's load from its own `/metrics`: requests running and queued, KV-pool usage.

The router's own in-flight count is immediate but sees only this router's requests; a server's
gauges (`sglang:num_running_reqs`, the waiting queues, `sglang:token_usage`; servers started with
`--enable-metrics`) see every router's and every queue, a poll interval late. `Peer.load` takes
the larger of the two. A peer whose page cannot be read keeps its last figures.
"""

from __future__ import annotations

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.router.peers import metrics_poll
from sglang_pdd.router.peers.pool import Peer

RUNNING, USAGE = "sglang:num_running_reqs", "sglang:token_usage"
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


def update(peer: Peer, text: str) -> bool:
    got = load_of(text)
    if got is None:
        return False
    peer.running, peer.kv_usage = got
    peer.waiting = sum(parse_exposition(text, WAITING).values())
    return True


async def poll_forever(session, peers: list[Peer], interval_s: float = 1.0) -> None:
    by_url = {p.url: p for p in peers}
    await metrics_poll.poll_forever(session, list(by_url), interval_s, lambda url, text: update(by_url[url], text),
                                    "load feed")
