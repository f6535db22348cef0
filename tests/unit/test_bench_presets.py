"""Contract of the presets' trace selection: whole sessions, their first turns, prompts intact."""

from collections import Counter

from sglang_pdd.bench.presets import PRESETS, get_preset, select
from sglang_pdd.workload.generator import generate, measured
from sglang_pdd.sim.presets import tiny_workload

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
