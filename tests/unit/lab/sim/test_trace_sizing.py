"""`--scenario sizing --trace FILE` (issue 46 item 3): the recommended deployment for a trace, against
xdc-pd-drc and same-dc-pd, with the trace's hit-rate bathtub. On a short window of the shared trace."""

from pathlib import Path

import pytest

from sglang_pdd.lab.sim.paper import PaperSetting
from sglang_pdd.lab.sim.trace_run import load_trace
from sglang_pdd.lab.sim.trace_sizing import bathtub_lines, recommended, run_trace_sizing, trace_sizing_report
from sglang_pdd.lab.workload.mooncake import MooncakeOptions

TRACE = Path(__file__).resolve().parents[4] / "sglang_pdd" / "lab" / "workload" / "traces" / "mooncake-synthetic.jsonl.xz"


@pytest.fixture(scope="module")
def short():
    return load_trace(str(TRACE), MooncakeOptions(end_s=15.0))


def test_the_bathtub_is_the_traces_own_hit_histogram(short):
    lines = bathtub_lines(short)
    shares = [float(x.split()[1].rstrip("%")) for x in lines[1:]]
    assert len(shares) == 5 and sum(shares) == pytest.approx(100.0, abs=0.5)
    hits = [r.prefix_hit_len / r.input_len for r in short.requests]
    cold, warm = sum(h < 0.2 for h in hits) / len(hits), sum(h >= 0.95 for h in hits) / len(hits)
    assert shares[0] == pytest.approx(cold * 100, abs=0.06) and shares[-1] == pytest.approx(warm * 100, abs=0.06)
    assert shares[0] > 90  # the trace's first seconds: nothing cached yet


def test_it_recommends_the_best_bcr_and_compares_it(short):
    res = run_trace_sizing(PaperSetting(), short, p_counts=(3, 4), md_counts=(4,))
    cands, drc, same = res
    best = recommended(cands)
    assert best.goodput.bcr == max(c.goodput.bcr for c in cands) > 0
    assert drc.spec.name == "xdc-pd-drc" and drc.spec.prefill.instances == best.spec.prefill.instances
    assert same.spec.name == "same-dc-pd"
    text = trace_sizing_report(short, PaperSetting(), res)
    for needle in ("Hit-rate bathtub", "Recommended:", "pool bounds 0..", "xdc-pd-drc, same P and MD", "same-dc-pd"):
        assert needle in text
