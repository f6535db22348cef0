import pytest

from sglang_pdd.router.request.stitch import Stitcher, StitchError


def byte_decode(ids):
    """Token i is byte i: a multi-byte UTF-8 character spans several tokens."""
    return bytes(ids).decode("utf-8", errors="replace")


HANDOFF = lambda k: {"type": "pdd_handoff", "handoff_tokens": k}  # noqa: E731
LENGTH = {"type": "length", "length": 6}


def test_relay_then_main_without_gap_or_duplicate():
    s = Stitcher(byte_decode)
    out = [s.feed_relay([104], None), s.feed_relay([104, 105], HANDOFF(2)),
           s.feed_main([104, 105, 33], None), s.feed_main([104, 105, 33, 33], LENGTH)]
    assert [d.token_ids for d in out] == [[104], [105], [33], [33]]
    assert "".join(d.text for d in out) == "hi!!"
    assert out[1].finish_reason is None  # the handoff finish never reaches the client
    assert s.finish_reason == LENGTH and s.ids == [104, 105, 33, 33]


def test_multibyte_character_split_across_the_handoff_comes_out_whole():
    euro = list("€".encode())  # 3 bytes
    s = Stitcher(byte_decode)
    d1 = s.feed_relay([97, euro[0]], HANDOFF(2))
    d2 = s.feed_main([97, euro[0], euro[1]], None)
    d3 = s.feed_main([97] + euro, LENGTH)
    assert (d1.text, d2.text, d3.text) == ("a", "", "€")


def test_relay_finishing_itself_is_final():
    s = Stitcher(byte_decode)
    s.feed_relay([97, 98], {"type": "stop", "matched": 2})
    assert s.done and s.ids == [97, 98]
    with pytest.raises(StitchError):
        s.feed_main([97, 98, 99], None)


def test_direct_pipeline_streams_main_from_the_start():
    s = Stitcher(byte_decode).direct()
    assert s.feed_main([97], None).text == "a"
    assert s.feed_main([97, 98], LENGTH).token_ids == [98]


@pytest.mark.parametrize("feeds, match", [
    ([("main", [1], None)], "before the relay handed off"),
    ([("relay", [1, 2], HANDOFF(3))], "handed off 3 tokens but streamed 2"),
    ([("relay", [1, 2], HANDOFF(2)), ("main", [1, 9, 3], None)], "eager tokens differ"),
    ([("relay", [1, 2], None), ("relay", [1], None)], "went back"),
])
def test_inconsistent_streams_are_errors_not_garbage(feeds, match):
    s = Stitcher(byte_decode)
    with pytest.raises(StitchError, match=match):
        for which, ids, fin in feeds:
            (s.feed_relay if which == "relay" else s.feed_main)(ids, fin)


def test_text_is_decoded_incrementally_not_the_whole_output_per_chunk():
    """issue 14 item 4: re-decoding the whole output on every chunk was O(n^2) router CPU."""
    decoded = []

    def counting(ids):
        decoded.append(len(ids))
        return byte_decode(ids)

    n = 4000
    s = Stitcher(counting).direct()
    text = "".join(s.feed_main([97 + i % 26 for i in range(j + 1)], LENGTH if j == n - 1 else None).text
                   for j in range(n))
    assert text == "".join(chr(97 + i % 26) for i in range(n))
    assert sum(decoded) <= 6 * n  # a window of a few tokens per chunk (the old way: n^2 / 2)


def test_incremental_text_equals_the_whole_decode_for_any_chunking():
    import random

    rng = random.Random(3)
    for _ in range(200):
        text = "".join(rng.choice(["a", "é", "€", "𝄞", " ", "z"]) for _ in range(rng.randrange(1, 40)))
        ids = list(text.encode())
        k = rng.randrange(0, len(ids) + 1)
        s = Stitcher(byte_decode)
        cuts = sorted(set(rng.sample(range(1, len(ids) + 1), min(len(ids), rng.randrange(1, 8)))) | {len(ids)})
        out, relay_done = [], k == 0
        if k:
            rc = sorted({c for c in cuts if c < k} | {k})
            for c in rc:
                out.append(s.feed_relay(ids[:c], HANDOFF(k) if c == k else None).text)
        else:
            s.direct()
        for c in (c for c in cuts if c > k or (k == len(ids) and c == k)):
            out.append(s.feed_main(ids[:c], LENGTH if c == len(ids) else None).text)
        assert "".join(out) == text, (text, k, cuts)


def _migrated(relayed: bool) -> Stitcher:
    """A stitcher whose first copy sent 'hi' (relay 'h', handoff, main 'i'), then failed."""
    s = Stitcher(byte_decode)
    s.feed_relay([104], HANDOFF(1))
    s.feed_main([104, 105], None)
    s.resume(relayed=relayed)
    return s


def test_a_migrated_relayed_copy_hands_off_again_after_what_was_sent():
    s = _migrated(relayed=True)  # the new copy's outputs follow 'hi'
    out = [s.feed_relay([33], None), s.feed_relay([33, 63], HANDOFF(2)), s.feed_main([33, 63, 33], LENGTH)]
    assert [d.token_ids for d in out] == [[33], [63], [33]] and s.ids == [104, 105, 33, 63, 33]
    assert "".join(d.text for d in out) == "!?!" and s.handoff_tokens == 2 and s.finish_reason == LENGTH


@pytest.mark.parametrize("feeds, match", [
    ([("main", [33], None)], "before the relay handed off"),
    ([("relay", [33, 63], HANDOFF(2)), ("main", [33, 33, 1], None)], "eager tokens differ"),
    ([("relay", [33, 63], None), ("relay", [33], None)], "went back"),
])
def test_a_migrated_relayed_copy_is_checked_as_a_first_one(feeds, match):
    s = _migrated(relayed=True)
    with pytest.raises(StitchError, match=match):
        for which, ids, fin in feeds:
            (s.feed_relay if which == "relay" else s.feed_main)(ids, fin)


def test_a_migrated_copy_without_relay_feeds_main_after_what_was_sent():
    s = _migrated(relayed=False)
    assert s.feed_main([33], None).token_ids == [33] and s.ids == [104, 105, 33]
    with pytest.raises(StitchError, match="relay output after the handoff"):
        s.feed_relay([33, 63], None)


# -- the router's own end of a stream, and the stop watch across a migration (issue 31) -------------
def test_end_after_a_migration_sends_nothing_again():
    s = Stitcher(byte_decode).direct()
    s.feed_main([97, 98, 99], None)
    s.resume()
    s.feed_main([100, 101], None)  # the migrated copy's output, after the 3 tokens the client has
    d = s.end({"type": "length", "length": 5})
    assert d.token_ids == [] and d.text == "" and d.finish_reason == {"type": "length", "length": 5}
    assert s.ids == [97, 98, 99, 100, 101] and s.ended_here


def test_end_of_a_relayed_copy_before_its_handoff():
    s = Stitcher(byte_decode)
    s.feed_relay([97], HANDOFF(1))
    s.feed_main([97, 98], None)
    s.resume(relayed=True)
    s.feed_relay([99], None)
    assert s.end({"type": "length", "length": 3}).token_ids == [] and s.ids == [97, 98, 99]


def test_end_at_part_of_a_chunk_flushes_its_text():
    euro = list("€".encode())
    s = Stitcher(byte_decode).direct()
    s.feed_main([97, euro[0]], None)
    d = s.end({"type": "stop", "matched": "€"}, [97] + euro)
    assert d.token_ids == euro[1:] and d.text == "€"


def test_the_stop_watch_finds_a_string_across_the_boundary_token_by_token():
    from sglang_pdd.router.request.stop_watch import StopWatch

    w = StopWatch(["cde", "zz"], byte_decode)
    ids = list(b"xxabc")
    w.arm(ids)
    assert w.first_stop(ids, list(b"d")) is None  # "cd": not yet
    ids += list(b"d")
    assert w.first_stop(ids, list(b"efg")) == (1, "cde")  # completes at the first token of the chunk


def test_the_stop_watch_across_a_split_character_and_its_limits():
    from sglang_pdd.router.request.stop_watch import StopWatch

    euro = list("€".encode())
    w = StopWatch("€b", byte_decode)
    ids = [97, euro[0]]  # the boundary splits the euro sign
    w.arm(ids)
    assert w.first_stop(ids, euro[1:] + [98, 99]) == (3, "€b")
    w = StopWatch(["ab"], byte_decode)  # wholly in the client's past: not acted on
    w.arm(list(b"xab"))
    assert w.first_stop(list(b"xab"), list(b"c")) is None
    w = StopWatch(["abc"], byte_decode)  # past the longest string's length no match can straddle: it stops
    w.arm(list(b"xa"))
    assert w.first_stop(list(b"xa"), list(b"qqq")) is None and not w.watching
    assert StopWatch(None, byte_decode).first_stop([1], [2]) is None
