"""The fault suite's classifier and table (sglang_pdd.lab.faults.outcome, report, scenarios)."""

import pytest

from sglang_pdd.lab.faults import report
from sglang_pdd.lab.faults.outcome import RequestRecord, classify, end_of_stream, matches
from sglang_pdd.lab.faults.report import ScenarioReport
from sglang_pdd.lab.faults.scenarios import SCENARIOS, parse
from sglang_pdd.lab.testing.identity import Reference


def rec(**kw) -> RequestRecord:
    base = dict(conv=0, turn=0, input_ids=[1, 2], max_new_tokens=3, output_ids=[5, 6, 7],
                finish_reason={"type": "length", "length": 3})
    return RequestRecord(**{**base, **kw})


def test_a_completed_request_is_identical_or_migrated_by_its_migrations():
    assert classify(rec(), True) == "identical"
    assert classify(rec(migrations=1), True) == "migrated"


def test_tokens_other_than_the_reference_are_silently_wrong_migrated_or_not():
    assert classify(rec(), False) == "wrong"
    assert classify(rec(migrations=1), False) == "wrong"


def test_a_stream_without_finish_or_error_is_silently_wrong_not_failed():
    assert classify(rec(finish_reason=None), None) == "wrong"


def test_a_stream_cut_without_done_failed_visibly_and_one_with_done_but_no_finish_is_wrong():
    cut = rec(finish_reason=None)
    end_of_stream(cut, done=False)
    assert "cut" in cut.error and classify(cut, None) == "failed"
    claimed = rec(finish_reason=None)
    end_of_stream(claimed, done=True)  # [DONE] without a finish: the router said it was complete
    assert not claimed.error and classify(claimed, None) == "wrong"
    finished = rec()
    end_of_stream(finished, done=False)
    assert not finished.error and classify(finished, True) == "identical"


def test_a_stream_that_went_back_is_wrong_even_when_its_last_chunk_matches():
    assert classify(rec(went_back=True), True) == "wrong"


def test_an_error_is_failed_and_a_request_past_its_deadline_hung():
    assert classify(rec(error="HTTP 502: relay unreachable", finish_reason=None), None) == "failed"
    assert classify(rec(hung=True, finish_reason=None), None) == "hung"
    assert classify(rec(hung=True, error="x"), None) == "hung"  # hung wins: the deadline passed


def test_a_completed_request_must_be_checked():
    with pytest.raises(ValueError):
        classify(rec(), None)


def test_matches_accepts_equal_tokens_and_a_certified_near_tie_only():
    ref = Reference([5, 6, 7], margins=[1.0, 1e-5, 1.0], runner_up=[9, 8, 9])
    assert matches(ref, [5, 6, 7])
    assert matches(ref, [5, 8, 3])  # the runner-up at a near tie: verified up to it
    assert not matches(ref, [5, 9, 7])  # not the runner-up
    assert not matches(Reference([5, 6, 7], [1.0, 1.0, 1.0], [9, 8, 9]), [5, 8, 7])  # no near tie there
    assert not matches(ref, [5, 6])  # short


def test_verdict_fails_on_hung_wrong_leaks_and_absorbable_failures():
    ok = ScenarioReport("s", absorbable=True)
    ok.counts.update(identical=3, migrated=1)
    assert ok.ok and ok.requests == 4
    for field, value in (("hung", 1), ("wrong", 1), ("failed", 1)):
        r = ScenarioReport("s", absorbable=True)
        r.counts[field] = value
        assert not r.ok, field
    unabsorbable = ScenarioReport("p", absorbable=False)
    unabsorbable.counts.update(failed=2, identical=1)
    assert unabsorbable.ok
    leaked = ScenarioReport("s", absorbable=True)
    leaked.leaked = ["main-0: 3 request rows free, 4 when idle"]
    assert not leaked.ok
    broken = ScenarioReport("s", absorbable=True)
    broken.harness_error = "never saw a handoff"
    assert not broken.ok


def test_table_has_the_issue_columns_and_one_row_per_scenario():
    a, b = ScenarioReport("wan-cut-5s", True), ScenarioReport("p-kill-mid-prefill", False)
    a.counts.update(identical=5, migrated=2)
    b.counts.update(failed=3)
    b.leaked = ["relay: 1 requests running or queued"]
    lines = report.table([a, b]).splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("| scenario | requests | completed token-identical | completed after migration | "
                               "failed with a clear error | hung | silently wrong | leaked")
    assert lines[2] == "| wan-cut-5s | 7 | 5 | 2 | 0 | 0 | 0 | 0 | ok |"
    assert lines[3] == "| p-kill-mid-prefill | 3 | 0 | 0 | 3 | 0 | 0 | relay: 1 requests running or queued | FAIL |"


def test_timing_takes_the_largest_gap_of_migrated_requests_and_the_median_of_others():
    r = ScenarioReport("s", True)
    r.timing([rec(gap_s=0.4, ttft_s=0.1), rec(gap_s=0.9, ttft_s=0.3)],
             [rec(gap_s=0.1, ttft_s=0.1), rec(gap_s=0.2, ttft_s=0.2), rec(gap_s=0.3, ttft_s=0.3)])
    assert r.gap_s == {"migrated": 0.9, "other": 0.2}
    assert r.ttft_s == {"migrated": 0.2, "other": 0.2}
    assert "largest client gap 0.90s" in report.details([r])


def test_json_is_versioned():
    r = ScenarioReport("s", True)
    out = report.to_json([r], runtime_s=1.0)
    assert out["version"] == report.VERSION and out["scenarios"][0]["ok"] and out["runtime_s"] == 1.0


def test_scenarios_in_the_issue_order_and_parse_keeps_the_given_one():
    names = [s.name for s in SCENARIOS]
    assert names[:3] == ["md-kill-after-handoff", "md-kill-before-handoff", "rld-kill-mid-stream"]
    assert names[-1] == "idle-then-traffic" and len(set(names)) == len(names) == 13
    assert [s.name for s in parse("wan-cut-5s,md-kill-after-handoff")] == ["wan-cut-5s", "md-kill-after-handoff"]
    assert parse("all") == SCENARIOS
    with pytest.raises(ValueError):
        parse("wan-cut-5s,nope")
    with pytest.raises(ValueError):
        parse("wan-cut-5s,wan-cut-5s")
    assert [s.name for s in SCENARIOS if not s.absorbable] == ["p-kill-mid-prefill", "router-restart-mid-stream",
                                                              "md-pool-exhausted"]


def test_every_other_conversation_samples_with_its_own_seed_and_the_rest_are_greedy():
    from sglang_pdd.lab.faults.traffic import TrafficSpec

    spec = TrafficSpec(conversations=4, seed=3)
    assert [spec.is_seeded(c) for c in range(4)] == [False, True, False, True]
    assert spec.sampling(0, 0) == spec.sampling(2, 1) == {}
    seeds = {spec.sampling(c, t)["sampling_seed"] for c in (1, 3) for t in range(3)}
    assert len(seeds) == 6  # a seed per conversation and turn
    assert spec.sampling(1, 0)["temperature"] > 0
    assert not any(TrafficSpec(seeded_every=0).is_seeded(c) for c in range(4))


class _Dep:
    """The deployment as classify_all sees it: the reference is asked through `call`."""

    def __init__(self, answers):
        self.servers = {"reference": type("S", (), {"url": "http://ref"})()}
        self.answers, self.asked = answers, []

    def call(self, name, fn, url, ids, n, **sampling):
        self.asked.append(sampling)
        return Reference(self.answers[bool(sampling)])


def test_a_seeded_request_is_checked_against_the_seeded_reference():
    from sglang_pdd.lab.faults.suite import classify_all

    seeded = {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 5}
    dep = _Dep({False: [5, 6, 7], True: [9, 8, 7]})  # greedy and seeded references differ
    r = ScenarioReport("s", True)
    classify_all(r, [rec(), rec(conv=1, output_ids=[9, 8, 7], sampling=seeded)], dep)
    assert dep.asked == [{}, seeded]
    assert r.counts["identical"] == 2 and r.seeded == {"identical": 1}
    assert "seeded sampling: 1 of the requests (identical 1)" in report.details([r])
    # negative control: the seeded tokens checked against the greedy reference are silently wrong
    r = ScenarioReport("s", True)
    classify_all(r, [rec(conv=1, output_ids=[9, 8, 7])], dep)
    assert r.counts["wrong"] == 1 and "diverges at step 0" in r.wrong[0]
