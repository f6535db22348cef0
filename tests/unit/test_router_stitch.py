import pytest

from sglang_pdd.router.stitch import Stitcher, StitchError


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
