"""A request's text as sglang's detokenizer makes it (`request_text.RequestText`, issue 47): decoded with the
request's own options, sglang's defaults where it sets none, the matched stop token cut unless asked not
to or it closes a tool call."""

import pytest

from sglang_pdd.router.request.request_text import RequestText
from sglang_pdd.router.request.stitch import Stitcher


def recording():
    """A decode with sglang's defaults that records the options it was given."""
    calls = []

    def decode(ids, skip_special_tokens=True, spaces_between_special_tokens=True):
        calls.append((skip_special_tokens, spaces_between_special_tokens))
        return "".join(chr(i) for i in ids)
    return decode, calls


@pytest.mark.parametrize("params, options", [
    ({}, (True, True)),
    ({"skip_special_tokens": None, "spaces_between_special_tokens": None}, (True, True)),
    ({"skip_special_tokens": True, "spaces_between_special_tokens": True}, (True, True)),
    ({"skip_special_tokens": False}, (False, True)),
    ({"skip_special_tokens": False, "spaces_between_special_tokens": False}, (False, False)),
])
def test_each_request_is_decoded_with_its_own_options(params, options):
    decode, calls = recording()
    RequestText.of(decode, params).decode([104, 105])
    assert calls == [options]


def test_a_request_with_sglangs_defaults_calls_decode_with_the_ids_alone():
    """A decode that takes no options serves every request that turns none off."""
    assert RequestText.of(lambda ids: "x" * len(ids), {"skip_special_tokens": True}).decode([1, 2]) == "xx"


EOS, CLOSE = 2, 9


@pytest.mark.parametrize("params, finish, kept, ids", [
    ({}, {"type": "stop", "matched": EOS}, (), [104, 105]),  # the stop token is cut
    ({"no_stop_trim": True}, {"type": "stop", "matched": EOS}, (), [104, 105, EOS]),
    ({}, {"type": "stop", "matched": CLOSE}, (CLOSE,), [104, 105, CLOSE]),  # a tool call's closer stays
    ({}, {"type": "stop", "matched": "hi"}, (), [104, 105, EOS]),  # a stop string: cut from the text elsewhere
    ({}, {"type": "length", "length": 3}, (), [104, 105, EOS]),
    ({}, None, (), [104, 105, EOS]),
])
def test_the_stop_token_that_ended_the_request_is_cut_as_sglang_cuts_it(params, finish, kept, ids):
    last = ids[-1] if ids[-1] in (EOS, CLOSE) else EOS
    assert RequestText.of(recording()[0], params, frozenset(kept)).text_ids([104, 105, last], finish) == ids


def test_the_stitcher_cuts_it_from_the_last_delta_only():
    text = RequestText.of(recording()[0], {})
    s = Stitcher(text.decode, text.text_ids).direct()
    deltas = [s.feed_main([104], None), s.feed_main([104, 105, EOS], {"type": "stop", "matched": EOS})]
    assert [d.text for d in deltas] == ["h", "i"] and s.ids == [104, 105, EOS]
    s = Stitcher(text.decode, text.text_ids).direct()  # a finish without new tokens: nothing to cut
    s.feed_main([104, 105], None)
    assert s.feed_main([104, 105], {"type": "stop", "matched": 105}).text == ""
