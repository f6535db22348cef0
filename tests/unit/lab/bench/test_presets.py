"""Contract of the presets' trace selection: whole sessions, their first turns, prompts intact."""

from collections import Counter

from sglang_pdd.lab.bench.presets import PRESETS, get_preset, select
from sglang_pdd.lab.workload.generator import generate, measured
from sglang_pdd.lab.sim.presets import tiny_workload

import pytest


def test_select_keeps_whole_sessions_and_their_first_turns():
    full = generate(tiny_workload(duration_s=60.0))
    sel = select(full, max_sessions=3, max_turns=2)
    m = measured(sel)
    per = Counter(r.session_id for r in m)
    assert len(per) == 3 and max(per.values()) <= 2
    by_id = {r.request_id: r for r in full}
    for r in sel:  # prompts unchanged, only the clock shifted
        assert r.segments == by_id[r.request_id].segments and r.input_len == by_id[r.request_id].input_len
    for sid in per:  # the kept turns are each session's first ones
        kept = sorted(r.turn for r in m if r.session_id == sid)
        assert kept == sorted(r.turn for r in measured(full) if r.session_id == sid)[: len(kept)]
    assert min(r.arrival_s for r in m) == 0.0
    warm = {r.session_id for r in sel if r.warmup}
    assert warm <= set(per)
    assert warm == {sid for sid in per if min((r for r in m if r.session_id == sid),
                                              key=lambda r: r.turn).prefix_hit_len > 0}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_fit_the_tiny_model_and_bound_the_run(name):
    p = get_preset(name)
    reqs = p.requests()
    m = measured(reqs)
    assert 0 < len(m) <= p.max_sessions * p.max_turns
    assert max(r.input_len for r in reqs) <= p.workload.max_input_len
    assert p.workload.vocab_size <= 2048  # TinyModelSpec().vocab
    assert all(max(r.token_ids(p.workload.vocab_size)) < p.workload.vocab_size for r in reqs)


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")


def test_congested_preset_shares_the_line_with_a_bulk_flow_and_jitter():
    p = get_preset("congested")
    assert p.background is not None and (p.background.src, p.background.dst) == ("A", "B")
    assert p.background.pace_mbit is None  # takes its TCP share, as a bulk copy does
    assert p.link.jitter_ms > 0
    # the paper's agentic mix, not cold turns: most turns are high-hit
    m = measured(p.requests())
    assert sum(r.prefix_hit_len / r.input_len > 0.9 for r in m) > len(m) / 2
    assert all(get_preset(n).background is None for n in PRESETS if n != "congested")


def test_demo_is_cold_turns_repeated_twice_unless_told_otherwise(monkeypatch):
    from sglang_pdd.lab import demo
    seen = []
    monkeypatch.setattr(demo, "bench_main", lambda argv: seen.append(argv) or 0)
    demo.main([])
    demo.main(["--preset=smoke", "--repeat", "1", "--systems", "pdd"])
    first = dict(zip(seen[0][::2], seen[0][1::2]))
    assert (first["--preset"], first["--repeat"], first["--systems"]) == ("demo", "2", "same-dc,cross-dc-drc,pdd")
    assert seen[1][:5] == ["--preset=smoke", "--repeat", "1", "--systems", "pdd"]  # given flags win
    assert seen[1][5] == "--out" and len(seen[1]) == 7
    demo_p, cold = get_preset("demo"), get_preset("cold")
    assert demo_p.workload == cold.workload and demo_p.max_sessions < cold.max_sessions
    assert {r.request_id for r in measured(demo_p.requests())} < {r.request_id for r in measured(cold.requests())}
