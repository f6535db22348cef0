"""The router's ZMQ side of MD's KV events: the subscriber against sglang's own publisher (live,
replayed, a dropped connection), a view per main, and the router's command line for the sources."""

from __future__ import annotations

import asyncio
import time

import pytest

from sglang_pdd.router.cache.exact_view import ExactCacheView
from sglang_pdd.router.cache.kv_subscriber import KvEventSource, KvEventSubscriber, main_views
from sglang_pdd.router.cache.prefix_view import PrefixView
from sglang_pdd.lab.testing.servers import free_port
from tests.fakes.kv_events import chain, msg, removed


def test_the_subscriber_follows_sglangs_zmq_publisher_and_replays_what_it_missed():
    kv = pytest.importorskip("sglang.srt.disaggregation.kv_events")
    from sglang.srt.mem_cache.events import StorageMedium

    pub_port, replay_port = free_port(), free_port()
    pub = kv.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{pub_port}", bind=True,
                               replay_endpoint=f"tcp://127.0.0.1:{replay_port}")

    def publish(*events):
        pub.publish(kv.KVEventBatch(ts=time.time(), events=list(events)))

    def store(hashes, parent, tokens):
        return kv.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=1,
                              lora_id=None, medium=StorageMedium.GPU)

    async def until(cond, what):
        for _ in range(500):
            if cond():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"subscriber never saw {what}")

    async def scenario():
        publish(kv.AllBlocksCleared(), store([1, 2, 3], None, [5, 6, 7]))  # before the router is up
        await asyncio.sleep(0.2)
        view = ExactCacheView(name="md")
        sub = KvEventSubscriber(KvEventSource(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"),
                                view, replay_timeout_s=2.0)
        sub.start()
        try:
            await until(lambda: view.exact and view.match([5, 6, 7]) == 3, "the replayed history")
            await asyncio.sleep(0.3)  # the subscription settles
            publish(kv.BlockRemoved(block_hashes=[3]))
            await until(lambda: view.match([5, 6, 7]) == 2, "a live eviction")
            return sub.feed.stats
        finally:
            await sub.close()

    try:
        stats = asyncio.run(scenario())
    finally:
        pub.shutdown()
    assert stats.replays == 1 and stats.malformed == {}


# -- the router's side --------------------------------------------------------------------------------
def test_only_mains_with_kv_events_get_an_exact_view():
    views, subs = main_views(["http://a:1", "http://b:1"], {"http://b:1": KvEventSource("tcp://b:5557")})
    assert isinstance(views["http://a:1"], PrefixView) and isinstance(views["http://b:1"], ExactCacheView)
    assert [s.view for s in subs] == [views["http://b:1"]]
    with pytest.raises(ValueError, match="unknown main"):
        main_views(["http://a:1"], {"http://c:1": KvEventSource("tcp://c:5557")})
    with pytest.raises(ValueError, match="not a bind wildcard"):
        KvEventSource("tcp://*:5557")


def test_router_cli_takes_one_kv_events_source_per_main():
    from sglang_pdd.router.__main__ import _kv_event_args, _peer_args, build_parser

    argv = ["--prefill", "http://p:1", "--main", "http://m:3", "--main", "http://n:3", "--tokenizer", "x"]
    args = build_parser().parse_args(argv + ["--main-kv-events", "tcp://m:5557", "tcp://m:5558",
                                             "--main-kv-events", "none"])
    mains = _peer_args(args.main, "main", None, "--main")
    assert _kv_event_args(args.main_kv_events, mains, "") == {
        "http://m:3": KvEventSource("tcp://m:5557", "tcp://m:5558")}
    args = build_parser().parse_args(argv + ["--main-kv-events", "tcp://m:5557"])
    with pytest.raises(SystemExit, match="one per --main"):
        _kv_event_args(args.main_kv_events, mains, "")
    assert _kv_event_args(build_parser().parse_args(argv).main_kv_events, mains, "") == {}


def test_the_subscriber_marks_its_view_stale_when_the_publisher_goes_away_and_exact_when_it_continues():
    import zmq

    port = free_port()
    ctx = zmq.Context()

    def publisher():
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(f"tcp://127.0.0.1:{port}")
        return pub

    async def until(cond, what, pub=None, frames=None):
        for _ in range(500):
            if cond():
                return
            if pub is not None:  # a PUB drops what it sends before the subscription arrived: resend
                pub.send_multipart(frames)
            await asyncio.sleep(0.02)
        raise AssertionError(f"subscriber never saw {what}")

    async def scenario():
        view = ExactCacheView(name="md")
        sub = KvEventSubscriber(KvEventSource(f"tcp://127.0.0.1:{port}"), view)
        pub = publisher()
        sub.start()
        try:
            await until(lambda: view.exact, "batch 0", pub, msg(0, chain([5, 6, 7])))
            pub.close(0)  # MD's publisher goes away: the subscriber's connection drops
            await until(lambda: not view.exact, "the disconnection")
            pub = publisher()
            await until(lambda: view.exact and view.match([5, 6, 7]) == 2, "batch 1", pub, msg(1, removed([102])))
            return sub.feed.stats
        finally:
            await sub.close()
            pub.close(0)

    try:
        stats = asyncio.run(scenario())
    finally:
        ctx.term()
    assert stats.disconnects >= 1 and stats.gaps == 0



@pytest.mark.parametrize("cap, dropped", [(64 << 10, True), (None, False)])
def test_a_message_over_the_size_cap_never_reaches_the_view(cap, dropped):
    """The KV-events subscriber caps a message's size (issue 31): a batch over the cap is dropped with
    its connection (ZMQ's MAXMSGSIZE), so the next batch shows a gap; with the default cap (the
    control) the same batch is applied and no gap shows."""
    import zmq

    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    big_tokens = list(range(1, 20_001))  # one stored chain of 20,000 tokens: ~100 KiB, over 64 KiB

    async def until(cond, what, send):
        for _ in range(500):
            if cond():
                return
            send()
            await asyncio.sleep(0.02)
        raise AssertionError(f"subscriber never saw {what}")

    async def scenario():
        view = ExactCacheView(name="md")
        kw = {} if cap is None else {"max_message_bytes": cap}
        sub = KvEventSubscriber(KvEventSource(f"tcp://127.0.0.1:{port}"), view, **kw)
        sub.start()
        try:
            first = msg(0, chain([5, 6, 7], first_hash=900_000))
            await until(lambda: view.exact and view.match([5, 6, 7]) == 3, "the first batch",
                        lambda: pub.send_multipart(first))
            pub.send_multipart(msg(1, chain(big_tokens)))
            third = msg(2, chain([8, 9], first_hash=800_000))
            await until(lambda: sub.feed.stats.gaps or view.match([8, 9]) == 2, "the third batch",
                        lambda: pub.send_multipart(third))
            return sub.feed.stats.gaps, view.exact and view.match(big_tokens)
        finally:
            await sub.close()

    try:
        gaps, big_matched = asyncio.run(scenario())
    finally:
        pub.close(linger=0)
        ctx.term()
    assert gaps == (1 if dropped else 0)
    assert big_matched == (0 if dropped else len(big_tokens)) or (dropped and big_matched is False)
