"""The handoff finish (protocol/handoff_finish.py): what RLD sends, what the router and clients read."""

import pytest

from sglang_pdd.protocol.handoff_finish import HandoffFinish, HandoffFinishError


def test_round_trip_and_wire_form():
    f = HandoffFinish(handoff_tokens=5, mode="catch-up")
    assert f.to_finish() == {"type": "pdd_handoff", "handoff_tokens": 5, "mode": "catch-up", "v": 1}
    assert HandoffFinish.from_finish(f.to_finish()) == f


def test_without_mode_or_version_reads_as_this_version():
    f = HandoffFinish.from_finish({"type": "pdd_handoff", "handoff_tokens": 3})
    assert (f.handoff_tokens, f.mode, f.v) == (3, None, 1)
    assert f.to_finish() == {"type": "pdd_handoff", "handoff_tokens": 3, "v": 1}


@pytest.mark.parametrize("finish", [None, {}, {"type": "length", "length": 6}, {"type": "stop", "matched": 2},
                                    {"type": "abort", "message": "x"}])
def test_any_other_finish_is_not_a_handoff(finish):
    assert HandoffFinish.from_finish(finish) is None


@pytest.mark.parametrize("finish, match", [
    ({"type": "pdd_handoff", "handoff_tokens": 3, "v": 2}, "version 2"),
    ({"type": "pdd_handoff"}, "handoff_tokens"),
    ({"type": "pdd_handoff", "handoff_tokens": "3"}, "int"),
    ({"type": "pdd_handoff", "handoff_tokens": -1}, "-1 tokens"),
    ({"type": "pdd_handoff", "handoff_tokens": 3, "mode": "adaptive"}, "mode 'adaptive'"),
    ({"type": "pdd_handoff", "handoff_tokens": 3, "extra": 1}, "extra"),
    ("pdd_handoff", "object"),
])
def test_malformed_or_unknown_version_is_refused(finish, match):
    with pytest.raises(HandoffFinishError, match=match):
        HandoffFinish.from_finish(finish)


def test_the_relay_runtime_finish_carries_it():
    pytest.importorskip("sglang.srt.managers.schedule_batch")
    from sglang_pdd.decode.relay.runtime import handoff_finish

    assert handoff_finish(4, "one-shot").to_json() == {"type": "pdd_handoff", "handoff_tokens": 4, "mode": "one-shot",
                                                       "v": 1}
