"""The router's exact view of MD's cache, from the KV events of a real decode server with the decode
radix cache (--kv-events-config, ZMQ): before each turn the view's hit must equal what MD really
reused, measured as the KV bytes P had to send (the prompt minus MD's hit), including after MD
evicted part of a conversation to make room for another (where the approximate view overestimates);
and the router, given `--main-kv-events`, decides on that exact hit."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sglang_pdd.router.cache.exact_view import ExactCacheView
from sglang_pdd.router.cache.kv_subscriber import KvEventSource, KvEventSubscriber
from sglang_pdd.router.cache.prefix_view import PrefixView
from sglang_pdd.lab.testing.client import generate, greedy_body, pd_generate
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import kv_bytes_per_token, kv_bytes_sent, metric, wait_until
from .shared_cluster import PAIR, PAIR_BOOT as BOOT, PAIR_EVENTS as EVENTS, PAIR_EVENTS_REPLAY as REPLAY
from .shared_cluster import PAIR_PORT, cluster_for

# shared_cluster.PAIR: MD's pool of 2400 tokens does not hold two of these conversations, so the second
# evicts part of the first; this module takes the pair first, while MD's cache is empty
pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(PAIR)]

NEW_TOKENS = 16


class Md:
    """The servers and a subscriber running on its own event loop (as in the router)."""

    def __init__(self, prefill, decode):
        self.prefill, self.decode = prefill, decode
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.view = ExactCacheView(PrefixView(), name="md")
        src = KvEventSource(f"tcp://127.0.0.1:{EVENTS}", f"tcp://127.0.0.1:{REPLAY}")
        self.sub = self.call(self._start, src)

    async def _start(self, src):
        sub = KvEventSubscriber(src, self.view)
        sub.start()
        return sub

    def call(self, fn, *args):
        """Run on the subscriber's loop (the view is only touched there)."""
        async def run():
            return fn(*args) if not asyncio.iscoroutinefunction(fn) else await fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def hit(self, ids: list[int]) -> tuple[bool, int]:
        return self.call(lambda: (self.view.exact, self.view.match(ids)))

    def wait_hit(self, ids: list[int], above: int, timeout_s: float = 60.0) -> int:
        """MD publishes its events when idle: wait until the view is exact and shows the last turn."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exact, n = self.hit(ids)
            if exact and n > above:
                return n
            time.sleep(0.2)
        raise AssertionError(f"the view never covered more than {above} tokens (exact={exact}, hit={n}, "
                             f"stale: {self.view.stale_reason!r}, stats {self.sub.feed.stats})")

    def turn(self, ids: list[int]) -> tuple[list[int], int]:
        """One PD request; returns its output and the KV bytes P sent for it."""
        before = kv_bytes_sent(self.prefill.url)
        out = pd_generate(self.prefill.url, self.decode.url, "127.0.0.1", BOOT,
                          greedy_body(ids, NEW_TOKENS))["output_ids"]
        return out, kv_bytes_sent(self.prefill.url) - before

    def close(self):
        self.call(self.sub.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def md(request, shared_clusters, tiny_model):
    pair = cluster_for(request, shared_clusters, tiny_model)
    m = Md(pair.prefill, pair.decode)
    yield m
    m.close()


def test_the_exact_view_predicts_the_kv_md_lacks_across_turns_and_evictions(md, prompts, tiny_model):
    kvb = kv_bytes_per_token(tiny_model)
    a1 = prompts.ids(700, seed=51)
    assert md.wait_hit(a1, above=-1) == 0  # the startup replay: MD's cache is known (empty)
    out, moved = md.turn(a1)
    assert moved == len(a1) * kvb

    a2 = a1 + out + prompts.ids(100, seed=52)
    hit = md.wait_hit(a2, above=len(a1))
    out, moved = md.turn(a2)
    assert moved == (len(a2) - hit) * kvb  # MD reused exactly what the view said
    a3 = a2 + out + prompts.ids(50, seed=53)
    before_b = md.wait_hit(a3, above=len(a2))

    b1 = prompts.ids(1750, seed=54)  # a second conversation: MD must evict part of the first
    approx = PrefixView()
    approx.insert(a3[:before_b])
    assert md.hit(b1) == (True, 0)
    _, moved = md.turn(b1)
    assert moved == len(b1) * kvb
    md.wait_hit(b1 + [0], above=len(b1) - 1)

    exact, hit = md.hit(a3)
    assert exact and hit < before_b == approx.match(a3)  # the eviction shrank the hit
    _, moved = md.turn(a3)
    assert moved == (len(a3) - hit) * kvb
    stats = md.sub.feed.stats
    assert stats.malformed == {} and stats.gaps == 0 and stats.restarts == 0


def router_view(url: str) -> tuple[float, float] | None:
    """(last KV-event batch applied, exact) of a router's view of its one MD."""
    seq, exact = (metric(url, f"sglang_pdd_router_md_kv_events_{n}") for n in ("seq", "exact"))
    return (next(iter(seq.values())), next(iter(exact.values()))) if seq and exact else None


def test_the_router_routes_on_mds_exact_cache(md, server_group, prompts, tiny_model):
    kvb = kv_bytes_per_token(tiny_model)
    router = server_group.start(f"router-{PAIR_PORT + 2}", PddRouterConfig(
        prefill=[(md.prefill.url, BOOT)], relay=[], main=[md.decode.url], tokenizer=tiny_model,
        port=PAIR_PORT + 2, pipeline="direct",
        extra=["--main-kv-events", f"tcp://127.0.0.1:{EVENTS}", f"tcp://127.0.0.1:{REPLAY}"],
        openai_frontend="builtin")).wait_ready()
    d1 = prompts.ids(500, seed=61)
    out, _ = md.turn(d1)  # not through the router: its approximate view never sees this conversation
    d2 = d1 + out + prompts.ids(60, seed=62)
    hit = md.wait_hit(d2, above=len(d1))
    seq = md.call(lambda: md.sub.feed.last_seq)

    def caught_up():
        view = router_view(router.url)
        return view is not None and view[0] >= seq and view[1] == 1

    wait_until(caught_up, f"the router's view exact, at MD's KV-event batch {seq}")  # it got the same broadcast
    before = kv_bytes_sent(md.prefill.url)
    meta = ReplyMeta.of(generate(router.url, greedy_body(d2, NEW_TOKENS))["meta_info"])
    moved = kv_bytes_sent(md.prefill.url) - before
    assert meta.pipeline == "P->MD" and meta.md_hit == hit
    assert moved == (len(d2) - hit) * kvb
    assert any("exact view of MD's cache" in line for line in router.log_text().splitlines())
