"""Contract of the agentic workload generator (sglang_pdd.lab.workload)."""

import numpy as np
import pytest

from sglang_pdd.lab.workload.distributions import HitBucket, HitHistogram, LengthRange
from sglang_pdd.lab.workload.generator import WorkloadConfig, generate, measured
from sglang_pdd.lab.workload.request import Segment, common_prefix_len, output_segment, truncate_segments
from sglang_pdd.lab.workload.trace import read_jsonl, write_jsonl


def _cfg(**kw):
    base = dict(request_rate=20.0, duration_s=200.0, seed=3, mean_turns=6.0, think_time_s=2.0)
    base.update(kw)
    return WorkloadConfig.cpu_bench(**base)


def test_default_histogram_mirrors_pdd_md():
    h = HitHistogram.default()
    assert 0.88 <= h.mean() <= 0.92
    assert 0.70 <= h.fraction_at_least(0.95) <= 0.80
    assert h.fraction_at_least(0.0) == pytest.approx(1.0)
    assert 0.0 < 1 - h.fraction_at_least(0.5) <= 0.1  # a thin low-hit tail


def test_generated_hit_histogram_matches_configuration():
    hist = HitHistogram.default()
    reqs = measured(generate(_cfg(hit_histogram=hist)))
    hits = np.array([r.hit_rate for r in reqs])
    n = len(hits)
    assert n > 2000
    for p, b in zip(hist.probabilities, hist.buckets):
        inside = np.mean((hits >= b.lo - 1e-3) & (hits < b.hi + 1e-3)) if b.hi < 1 else np.mean(hits >= b.lo - 1e-3)
        sigma = np.sqrt(p * (1 - p) / n)
        assert abs(inside - p) < 4 * sigma + 0.01, (b, inside, p)
    assert abs(hits.mean() - hist.mean()) < 0.01


def test_custom_histogram_is_followed():
    hist = HitHistogram((HitBucket(0.2, 0.3, 1.0), HitBucket(0.8, 0.9, 1.0)))
    hits = np.array([r.hit_rate for r in measured(generate(_cfg(hit_histogram=hist)))])
    low, high = np.mean((hits > 0.19) & (hits < 0.31)), np.mean((hits > 0.79) & (hits < 0.91))
    assert low + high > 0.98
    assert abs(low - 0.5) < 0.05


def test_prefix_hit_is_real_shared_tokens_with_previous_turn():
    cfg = _cfg(duration_s=60.0)
    reqs = generate(cfg)
    by_session = {}
    for r in sorted(reqs, key=lambda r: (r.session_id, r.turn)):
        by_session.setdefault(r.session_id, []).append(r)
    checked = 0
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:]):
            ids_prev = prev.token_ids(cfg.vocab_size)
            ids_cur = cur.token_ids(cfg.vocab_size)
            p = cur.prefix_hit_len
            assert len(ids_cur) == cur.input_len
            if prev.warmup:
                assert ids_cur[:p] == ids_prev[:p] and prev.input_len == p
            else:  # history = previous prompt + its output: the prompt part is shared verbatim
                k = min(p, prev.input_len)
                assert ids_cur[:k] == ids_prev[:k]
                if p > prev.input_len:  # the rest of the hit is the previous turn's output
                    assert any(s.source == "output" and s.turn == prev.turn for s in cur.segments)
            checked += 1
    assert checked > 50


def test_real_outputs_substitute_the_stand_in():
    cfg = _cfg(duration_s=60.0)
    reqs = [r for r in measured(generate(cfg)) if any(s.source == "output" for s in r.segments)]
    r = reqs[0]
    seg = next(s for s in r.segments if s.source == "output")
    real = {seg.turn: [1] * seg.length}
    ids = r.token_ids(cfg.vocab_size, outputs=real)
    assert len(ids) == r.input_len
    assert ids.count(1) >= seg.length  # 1 is below reserved_low, never drawn otherwise
    assert ids != r.token_ids(cfg.vocab_size)


def test_token_ids_stay_in_vocab_and_are_deterministic():
    cfg = _cfg(duration_s=20.0, vocab_size=512)
    a, b = generate(cfg), generate(cfg)
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]
    ids = a[3].token_ids(512)
    assert min(ids) >= 16 and max(ids) < 512
    assert generate(_cfg(duration_s=20.0, seed=4))[3].to_dict() != a[3].to_dict()


def test_truncated_segment_expands_to_a_prefix():
    s = Segment(1234, 1000)
    full = s.expand(4096)
    assert (s.truncated(300).expand(4096) == full[:300]).all()
    segs = [Segment(1, 10), Segment(2, 20), output_segment(1, 5)]
    assert sum(x.length for x in truncate_segments(segs, 25)) == 25
    assert common_prefix_len(segs, truncate_segments(segs, 25)) == 25
    assert common_prefix_len(segs, [Segment(1, 10), Segment(3, 20)]) == 10


def test_jsonl_round_trip(tmp_path):
    reqs = generate(_cfg(duration_s=20.0))
    path = tmp_path / "trace.jsonl"
    write_jsonl(reqs, path)
    back = read_jsonl(path)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in reqs]


def test_minimal_trace_records_load_but_cannot_expand(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 1.5, "input_len": 100, "prefix_hit_len": 90, "max_output_tokens": 8}\n')
    (r,) = read_jsonl(path)
    assert r.hit_rate == pytest.approx(0.9)
    with pytest.raises(ValueError):
        r.token_ids(1000)


def test_odd_traffic_share_and_lengths():
    cfg = _cfg(odd_fraction=0.04, odd_output_len=LengthRange(8, 16), output_len=LengthRange(64, 128))
    reqs = measured(generate(cfg))
    odd = [r for r in reqs if r.odd]
    assert abs(len(odd) / len(reqs) - 0.04) < 0.015
    assert all(8 <= r.max_output_tokens <= 16 for r in odd)
    assert all(64 <= r.max_output_tokens <= 128 for r in reqs if not r.odd)


def test_lengths_respect_limits_and_paper_scale():
    cfg = WorkloadConfig.paper(duration_s=60.0, request_rate=5.0)
    reqs = measured(generate(cfg))
    assert all(r.input_len <= cfg.max_input_len and 0 <= r.prefix_hit_len < r.input_len for r in reqs)
    total = np.mean([r.input_len + r.max_output_tokens for r in reqs])
    assert 55_000 < total < 72_000


def test_request_rate_is_about_configured():
    cfg = _cfg(request_rate=10.0, duration_s=300.0)
    n = len(measured(generate(cfg)))
    assert 0.7 * 3000 < n < 1.3 * 3000


@pytest.mark.parametrize("kw", [dict(request_rate=0.0), dict(odd_fraction=1.5),
                                dict(max_input_len=100), dict(vocab_size=8), dict(mean_turns=0.5)])
def test_invalid_configuration_is_rejected(kw):
    with pytest.raises(ValueError):
        WorkloadConfig(**kw)
