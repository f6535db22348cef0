"""Contract of the router's exact view of MD's cache from sglang's KV events: what a hit is (whole
blocks along the stored chain), eviction shrinking it, unknown parents and removals, the ordering
of batches (duplicates, gaps, replay, publisher restarts), malformed messages counted and skipped,
and the wire format itself against sglang's own radix cache (the ZMQ side: test_kv_subscriber)."""

from __future__ import annotations

import random
import time

import msgspec
import pytest

from sglang_pdd.router.cache.exact_view import ExactCacheView
from sglang_pdd.router.cache.kv_events import KvEventFeed
from sglang_pdd.router.cache.prefix_view import PrefixView
from tests.fakes.kv_events import CLEARED, chain, msg, payload, removed, stored


# -- the view ---------------------------------------------------------------------------------------
def test_a_hit_is_the_leading_blocks_along_the_stored_chain():
    v = ExactCacheView()
    v.store([1, 2, 3], None, [10, 11, 12, 13, 14, 15], block_size=2)
    v.store([4], 2, [20, 21], block_size=2)  # a branch after the second block
    assert v.exact_match([10, 11, 12, 13, 14, 15, 99]) == 6
    assert v.exact_match([10, 11, 12, 13, 20, 21]) == 6
    assert v.exact_match([10, 11, 12, 99]) == 2  # a block counts only whole
    assert v.exact_match([10, 11, 12]) == 2 and v.exact_match([11]) == 0 and v.exact_match([]) == 0


def test_eviction_makes_the_hit_shrink_and_unknown_removals_are_ignored():
    v = ExactCacheView()
    v.store([1, 2, 3, 4], None, [5, 6, 7, 8], block_size=1)
    assert v.exact_match([5, 6, 7, 8]) == 4
    assert v.remove([4, 3]) == 0
    assert v.exact_match([5, 6, 7, 8]) == 2
    assert v.remove([999, 3]) == 2  # never stored / already gone
    assert v.blocks == 2


def test_blocks_with_unknown_parents_wait_until_the_parent_is_stored():
    v = ExactCacheView()
    v.store([2, 3], 1, [6, 7], block_size=1)
    assert v.exact_match([5, 6, 7]) == 0
    v.store([1], None, [5], block_size=1)
    assert v.exact_match([5, 6, 7]) == 3
    v.remove([1])  # a parent gone: nothing past it is a hit, even if the children are held
    assert v.exact_match([5, 6, 7]) == 0
    v.store([1], None, [5], block_size=1)
    assert v.exact_match([5, 6, 7]) == 3


def test_a_block_is_held_while_any_medium_holds_it():
    v = ExactCacheView()
    v.store([1, 2], None, [5, 6], block_size=1, medium="GPU")
    v.store([2], 1, [6], block_size=1, medium="CPU_PINNED")  # backed up to host memory
    v.remove([2], medium="GPU")
    assert v.exact_match([5, 6]) == 2
    v.remove([2], medium="CPU_PINNED")
    assert v.exact_match([5, 6]) == 1


@pytest.mark.parametrize("hashes, tokens, size", [([1, 2], [5, 6, 7], 1), ([1], [], 1), ([1], [5], 0), ([], [], 1)])
def test_a_store_whose_tokens_do_not_fit_its_blocks_is_rejected(hashes, tokens, size):
    with pytest.raises(ValueError, match="BlockStored"):
        ExactCacheView().store(hashes, None, tokens, block_size=size)


def test_a_stale_view_answers_from_the_approximate_view_the_router_feeds():
    v = ExactCacheView(PrefixView())
    v.store([1, 2], None, [5, 6], block_size=1)
    v.insert([5, 6, 7, 8])  # the exact part ignores what the router sent
    assert not v.exact and v.match([5, 6, 7, 8]) == 4
    v.mark_exact("test")
    assert v.match([5, 6, 7, 8]) == 2


# -- ordering and resync ----------------------------------------------------------------------------
def test_batches_from_the_first_make_the_view_exact_and_clear_empties_it():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, CLEARED, chain([5, 6, 7])))
    f.on_message(msg(1, removed([102])))
    assert f.view.exact and f.view.match([5, 6, 7]) == 2
    f.on_message(msg(2, CLEARED))
    assert f.view.exact and f.view.match([5, 6, 7]) == 0 and f.stats.batches == 3


def test_a_lost_batch_without_replay_makes_the_view_stale_until_md_clears_its_cache():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, chain([5, 6, 7])))
    f.view.insert([5, 6, 7, 8, 9])
    f.on_message(msg(2, removed([102])))  # batch 1 never arrived
    assert not f.view.exact and f.stats.gaps == 1 and "lost batches 1..1" in f.view.stale_reason
    assert f.view.match([5, 6, 7, 8, 9]) == 5  # the fallback
    f.on_message(msg(3, CLEARED, chain([5, 6])))
    assert f.view.exact and f.view.match([5, 6, 7, 8, 9]) == 2


def test_subscribing_late_without_replay_is_stale():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(7, chain([5, 6])))
    assert not f.view.exact and "subscribed at batch 7" in f.view.stale_reason
    assert f.view.exact_match([5, 6]) == 2  # what it learns is kept, for when it is exact again


def test_a_gap_is_healed_by_a_replay_from_the_last_applied_batch():
    f = KvEventFeed(ExactCacheView(), can_replay=True)
    assert f.resync_from == 0  # learns MD's history first
    b0, b1 = payload(chain([5, 6, 7])), payload(stored([103], 102, [8]))
    f.on_replay(0, [(0, b0)])
    assert f.view.exact and f.resync_from is None
    f.on_message([b"", (1).to_bytes(8, "big"), b1])
    b2, b3 = payload(removed([103])), payload(stored([104], 102, [9]))
    f.on_message([b"", (3).to_bytes(8, "big"), b3])  # batch 2 lost
    assert f.resync_from == 1 and f.view.exact_match([5, 6, 7, 9]) == 3  # 3 held, not applied yet
    f.on_replay(1, [(1, b1), (2, b2), (3, b3)])
    assert f.view.exact and f.last_seq == 3 and f.stats.batches == 4
    assert f.view.match([5, 6, 7, 8]) == 3 and f.view.match([5, 6, 7, 9]) == 4
    f.on_message([b"", (3).to_bytes(8, "big"), b3])  # a duplicate is dropped
    assert f.stats.duplicates == 1 and f.stats.batches == 4


def test_a_replay_that_does_not_continue_our_history_relearns_from_the_first_batch():
    f = KvEventFeed(ExactCacheView(), can_replay=True)
    f.on_replay(0, [(0, payload(chain([5, 6]))), (1, payload(chain([7], 200)))])
    f.on_message(msg(5, chain([8], 300)))  # gap 2..4
    assert f.resync_from == 1
    f.on_replay(1, [(1, payload(chain([9], 400))), (2, payload())])  # MD restarted meanwhile
    assert f.resync_from == 0 and f.stats.restarts == 1 and not f.view.exact
    f.on_replay(0, [(0, payload(CLEARED, chain([1, 2]))), (1, payload()), (5, payload())])
    assert not f.view.exact and "skipped batches 2..4" in f.view.stale_reason
    f2 = KvEventFeed(ExactCacheView(), can_replay=True)
    f2.on_replay(0, [(0, payload(chain([5, 6])))])
    f2.on_message(msg(3, chain([8], 300)))
    f2.on_replay(0, [(0, payload(chain([1, 2]))), (1, payload()), (2, payload()), (3, payload())])
    assert f2.view.exact and f2.view.match([1, 2]) == 2 and f2.view.match([5, 6]) == 0


def test_the_same_batch_number_with_other_content_means_md_restarted_empty():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, chain([5, 6, 7])))
    f.on_message(msg(1, chain([8], 200)))
    f.on_message(msg(0, CLEARED, chain([9], 300)))  # a new publisher process
    assert f.stats.restarts == 1 and f.view.exact
    assert f.view.match([5, 6, 7]) == 0 and f.view.match([9]) == 1


def test_startup_replay_of_nothing_is_an_empty_exact_view_and_a_rolled_buffer_is_stale():
    f = KvEventFeed(ExactCacheView(), can_replay=True)
    f.on_replay(0, [])
    assert f.view.exact and f.view.match([1]) == 0
    f.on_message(msg(0, chain([1])))
    assert f.view.exact and f.view.match([1]) == 1
    g = KvEventFeed(ExactCacheView(), can_replay=True)
    g.on_replay(0, [(40, payload(chain([1])))])
    assert not g.view.exact and "no longer in its replay buffer" in g.view.stale_reason
    assert g.view.exact_match([1]) == 1


def test_a_replay_endpoint_that_does_not_answer_is_not_asked_again_for_a_while():
    now = [0.0]
    f = KvEventFeed(ExactCacheView(), can_replay=True, replay_retry_s=30, clock=lambda: now[0])
    f.on_message(msg(4, chain([1])))  # subscribed late: held until the replay
    assert f.resync_from == 0
    f.on_replay(0, None)
    assert not f.view.exact and f.view.exact_match([1]) == 1 and not f.can_replay
    f.on_message(msg(6, chain([2], 200, parent=100)))  # a gap while replay is down: stale, no resync
    assert f.resync_from is None and f.view.exact_match([1, 2]) == 2
    now[0] = 31.0
    f.on_message(msg(8, chain([3], 300, parent=200)))
    assert f.can_replay and f.resync_from == 6


# -- malformed messages -----------------------------------------------------------------------------
@pytest.mark.parametrize("frames, reason", [
    ([b"", b"\0" * 8], "bad-frames"),
    ([b"", b"\0" * 4, payload()], "bad-seq"),
])
def test_malformed_messages_are_counted_and_skipped(frames, reason):
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, chain([5])))
    f.on_message(frames)
    f.on_message(msg(1, chain([6], 200, parent=100)))
    assert f.stats.malformed == {reason: 1} and f.view.exact and f.view.match([5, 6]) == 2


@pytest.mark.parametrize("bad", [
    b"\xc1garbage", msgspec.msgpack.encode({"ts": 1}), payload({"type": "BlockMoved", "block_hashes": [1]}),
    payload(stored([1, 2], None, [5])),  # two blocks, one token
    payload({"type": "BlockStored", "block_hashes": ["x"], "parent_block_hash": None, "token_ids": [5],
             "block_size": 1}),
])
def test_a_batch_that_cannot_be_applied_is_counted_and_makes_the_view_stale(bad):
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, chain([5])))
    f.on_message([b"", (1).to_bytes(8, "big"), bad])
    assert sum(f.stats.malformed.values()) == 1 and not f.view.exact
    f.on_message(msg(2, chain([6], 200, parent=100)))  # still in sequence: no gap counted
    assert f.stats.gaps == 0 and f.view.exact_match([5, 6]) == 2


def test_stores_in_another_cache_namespace_are_never_a_hit():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, stored([1], None, [5], cache_salt="s"), stored([2], None, [6], lora_name="a")))
    assert f.stats.foreign == 2 and f.view.exact and f.view.match([5]) == 0 and f.view.match([6]) == 0


def test_bigram_token_pairs_index_by_their_first_token():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, stored([1, 2], None, [[5, 6], [6, 7]])))
    assert f.view.match([5, 6, 7]) == 2


# -- against sglang itself --------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4])
def test_the_view_matches_sglangs_radix_cache_through_inserts_and_evictions(page_size):
    torch = pytest.importorskip("torch")
    rc = pytest.importorskip("sglang.srt.mem_cache.radix_cache")
    from sglang.srt.disaggregation.kv_events import KVEventBatch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    class Allocator:
        device = "cpu"

        def free(self, *_, **__):
            pass

        free_segment = free

    cache = rc.RadixCache.create_simulated(page_size=page_size, enable_kv_cache_events=True,
                                           mock_allocator=Allocator())
    feed = KvEventFeed(ExactCacheView(), can_replay=False)
    rng = random.Random(page_size)
    seqs: list[list[int]] = []
    seq = 0
    for step in range(60):
        if seqs and rng.random() < 0.5:  # continue a conversation: its prefix, then new tokens
            ids = rng.choice(seqs)[:rng.randrange(1, 40)] + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        else:
            ids = [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
        seqs.append(ids)
        cache.insert(InsertParams(key=rc.RadixKey(ids), value=torch.arange(len(ids))))
        if step % 7 == 6:
            cache.evict(EvictParams(num_tokens=rng.randrange(1, 60)))
        feed.on_message([b"", seq.to_bytes(8, "big"),
                         msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=cache.take_events()))])
        seq += 1
        for q in rng.sample(seqs, min(5, len(seqs))):
            q = q + [99]
            want = cache.match_prefix(MatchPrefixParams(key=rc.RadixKey(q))).device_prefix_len
            assert feed.view.match(q) == want, (step, q)
    assert feed.view.exact and feed.stats.malformed == {} and feed.stats.unknown_removed == 0


# -- liveness: a dropped connection ---------------------------------------------------------------------
def test_a_dropped_connection_is_stale_until_the_next_batch_shows_nothing_was_lost():
    f = KvEventFeed(ExactCacheView(), can_replay=False)
    f.on_message(msg(0, chain([5, 6, 7])))
    f.on_disconnect()
    assert not f.view.exact and "connection" in f.view.stale_reason and f.stats.disconnects == 1
    f.on_message(msg(1, removed([102])))  # the next number: nothing was published meanwhile
    assert f.view.exact and f.view.match([5, 6, 7]) == 2
    f.on_disconnect()
    f.on_message(msg(3, removed([101])))  # batch 2 went out while we were away
    assert not f.view.exact and "lost batches 2..2" in f.view.stale_reason


def test_a_dropped_connection_with_replay_asks_from_the_last_batch_and_a_continuation_is_exact():
    f = KvEventFeed(ExactCacheView(), can_replay=True)
    f.on_replay(0, [(0, payload(chain([5, 6, 7])))])
    assert f.view.exact
    f.on_disconnect()
    assert not f.view.exact and f.resync_from == 0
    f.on_replay(0, [(0, payload(chain([5, 6, 7]))), (1, payload(removed([102])))])
    assert f.view.exact and f.view.match([5, 6, 7]) == 2 and f.last_seq == 1
