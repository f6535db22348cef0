"""Contract of the benchmark's metrics: percentiles, TPOT, SLA goodput, bytes per request."""

import math

import numpy as np
import pytest

from sglang_pdd.lab.bench.client import tpot
from sglang_pdd.lab.bench.metrics import RequestRecord, WanBytes, percentile, summarize
from sglang_pdd.lab.bench.presets import Sla


def _rec(i, ttft, e2e, out=33, ok=True, sent=0.0):
    return RequestRecord(request_id=f"s0-t{i}", session_id=0, turn=i, input_len=100, hit_rate=0.9,
                         sent_s=sent, ok=ok, ttft_s=ttft if ok else None, e2e_s=e2e if ok else None,
                         tpot_s=tpot(ttft, e2e, out) if ok else None, output_tokens=out if ok else 0)


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q):
    xs = [3.0, 0.5, 7.25, 1.0, 2.0, 9.5, 4.0]
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_ignores_missing_and_is_nan_when_empty():
    assert percentile([None, 1.0, float("nan"), 3.0], 50) == pytest.approx(2.0)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_tpot_is_the_mean_gap_after_the_first_token():
    assert tpot(1.0, 4.1, 32) == pytest.approx(0.1)
    assert tpot(1.0, 1.0, 1) == 0.0
    assert tpot(None, 2.0, 10) is None
    assert tpot(1.0, 2.0, 0) is None


def test_goodput_needs_both_targets_and_a_finished_request():
    sla = Sla(ttft_s=2.0, tpot_s=0.1)
    recs = [_rec(1, 1.0, 1.0 + 32 * 0.05),  # meets both
            _rec(2, 2.0, 2.0 + 32 * 0.1),  # exactly on both targets: meets
            _rec(3, 2.5, 2.5 + 32 * 0.01),  # TTFT miss
            _rec(4, 0.5, 0.5 + 32 * 0.2),  # TPOT miss
            _rec(5, 0.1, 0.2, ok=False)]  # failed
    assert [r.meets(sla) for r in recs] == [True, True, False, False, False]
    s = summarize("x", recs, sla, WanBytes(1000, 0, 500))
    assert s.goodput_requests == 2 and s.goodput_share == pytest.approx(0.4)
    assert s.failed == 1 and s.requests == 5


def test_summary_percentiles_window_and_bytes_per_request():
    recs = [_rec(i, t, t + 1.0, sent=float(i)) for i, t in enumerate([1.0, 2.0, 3.0, 4.0])]
    s = summarize("x", recs, Sla(10.0, 10.0), WanBytes(a_to_b=3000, b_to_a=1000, kv_sent=2000))
    assert s.ttft_p50_s == pytest.approx(2.5)
    assert s.ttft_p90_s == pytest.approx(float(np.percentile([1, 2, 3, 4], 90)))
    assert s.window_s == pytest.approx(3.0 + 4.0 + 1.0)  # first send 0, last done 3 + 5
    assert s.goodput_rps == pytest.approx(4 / 8.0)
    assert s.wan_bytes_per_request == pytest.approx(1000.0)
    assert s.kv_bytes_per_request == pytest.approx(500.0)
    assert summarize("x", recs, Sla(), WanBytes(0, 0, None)).kv_bytes_per_request is None
