"""The migration policy (issue 18): which failures migrate, on which pipeline, and the resumed request."""

import pytest

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.router.request.migration import rules as migration
from sglang_pdd.router.peers.upstream import UpstreamError


@pytest.mark.parametrize("role, main_ok, relay_ok, want, may_relay", [
    ("main", True, True, Pipeline.P_MD, True),  # another MD; through a relay if the pipeline policy says so
    ("main", True, False, Pipeline.P_MD, False),
    ("main", False, True, Pipeline.P_RLD, False),
    ("main", False, False, Pipeline.P_MD, False),
    ("relay", True, True, Pipeline.P_MD, False),  # MD holds the KV: straight to it
    ("relay", True, False, Pipeline.P_MD, False),
    ("relay", False, True, Pipeline.P_RLD, False),
    ("prefill", True, True, Pipeline.P_MD, True),
    ("prefill", True, False, Pipeline.P_MD, False),
])
def test_the_path_after_a_failure(role, main_ok, relay_ok, want, may_relay):
    d = migration.decide(role, "unreachable", 0, 1, {}, 3, main_ok=main_ok, relay_ok=relay_ok)
    assert d.pipeline is want and d.may_relay is may_relay


@pytest.mark.parametrize("cause, n, sp, sent", [
    (None, 0, {}, 3),  # a client's error
    ("5xx", 1, {}, 3),  # the limit
    ("5xx", 0, {"regex": "a+"}, 3),  # its grammar would start over
])
def test_what_does_not_migrate(cause, n, sp, sent):
    assert migration.decide("main", cause, n, 1, sp, sent, main_ok=True, relay_ok=True).pipeline is None


def test_constrained_decoding_migrates_before_any_token():
    assert migration.decide("main", "5xx", 0, 1, {"regex": "a+"}, 0, main_ok=True, relay_ok=True).pipeline


def test_causes():
    assert migration.cause_of(UpstreamError("main", "u", 400, "bad")) is None
    assert migration.cause_of(UpstreamError("main", "u", 503, "busy")) == "5xx"
    assert migration.cause_of(UpstreamError("main", "u", None, "x", kind="unreachable")) == "unreachable"
    assert migration.cause_of(UpstreamError("main", "u", None, "x", kind="abort")) == "abort"
    assert migration.cause_of(UpstreamError("main", "u", 400, "x", kind="abort")) is None
    assert migration.cause_of(KeyError("bug")) is None


def test_the_resumed_request():
    ids, sp = migration.resumed_request([1, 2], {"max_new_tokens": 10, "min_new_tokens": 4, "temperature": 0.5,
                                                 "sampling_seed": 7}, [3, 4, 5])
    assert ids == [1, 2, 3, 4, 5]
    assert sp == {"max_new_tokens": 7, "min_new_tokens": 1, "temperature": 0.5, "sampling_seed": 7}
    assert migration.resumed_request([1], {"max_new_tokens": 3}, [1, 2, 3]) is None
    assert migration.continued_finish({"type": "length", "length": 7}, 3) == {"type": "length", "length": 10}
    assert migration.continued_finish({"type": "stop", "matched": 2}, 3) == {"type": "stop", "matched": 2}
