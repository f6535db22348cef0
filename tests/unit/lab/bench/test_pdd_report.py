"""The PDD section of the bench report: pipelines, handoff modes, odd-traffic savings, drift."""

from types import SimpleNamespace

from sglang_pdd.lab.bench import pdd_report
from sglang_pdd.lab.bench.metrics import RequestRecord


def rec(i, pipeline, sent, md_hit=None, mode="", k=None, missed=None, reason="", rld=0, hit=0.9, tpot=0.05):
    return RequestRecord(request_id=f"r{i}", session_id=i, turn=0, input_len=1000, hit_rate=hit, sent_s=sent,
                         ok=True, ttft_s=0.5, e2e_s=2.0, tpot_s=tpot, prompt_tokens=1000, output_tokens=32,
                         pipeline=pipeline, handoff_tokens=k, handoff_mode=mode, md_hit=md_hit,
                         missed_bytes=missed, rld_in_flight=rld, route_reason=reason)


def test_stats_count_pipelines_modes_and_odd_savings():
    rs = [rec(0, "P->MD", 0.0, md_hit=900),
          rec(1, "P->RLD->MD", 1.0, md_hit=100, mode="one-shot", k=5, tpot=0.04),
          rec(2, "P->RLD->MD", 2.0, md_hit=100, mode="catch-up", k=30, tpot=0.06),
          rec(3, "P->RLD", 3.0, md_hit=0, missed=1 << 20, reason="odd traffic: output 8 < 33"),
          rec(4, "P->RLD", 4.0, md_hit=0, missed=2 << 20, reason="relay-only allowed: MD hit 0.000 < 0.9")]
    st = pdd_report.pdd_stats(rs)
    assert st["pipelines"] == {"P->MD": 1, "P->RLD->MD": 2, "P->RLD": 2}
    assert st["handoff_modes"] == {"one-shot": 1, "catch-up": 1}
    assert st["odd_requests"] == 1 and st["odd_wan_bytes_avoided"] == 1 << 20
    assert st["relay_only_requests"] == 1 and st["relay_only_wan_bytes_avoided"] == 2 << 20
    assert abs(st["handoff_tpot_p99_s"] - 0.0598) < 1e-3


def test_drift_shows_md_hit_falling_and_relay_load_climbing():
    rs = [rec(i, "P->RLD", float(i), md_hit=max(0, 900 - 100 * i), rld=i) for i in range(9)]
    thirds = pdd_report.pdd_stats(rs)["thirds"]
    assert [t["requests"] for t in thirds] == [3, 3, 3]
    assert thirds[0]["md_hit"] > thirds[1]["md_hit"] > thirds[2]["md_hit"]
    assert thirds[0]["rld_in_flight"] < thirds[2]["rld_in_flight"]
    lines = pdd_report.markdown([SimpleNamespace(name="pdd-relay-only", records=rs)])
    assert any(line.startswith("| pdd-relay-only | P->RLD 9") for line in lines)


def test_systems_without_the_pdd_router_get_no_section():
    assert pdd_report.markdown([SimpleNamespace(name="cross-dc", records=[rec(0, "", 0.0)])]) == []
