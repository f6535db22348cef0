"""Contract of the report writers: JSON, markdown table, and the simulator's calibration format."""

import json

import pytest

from sglang_pdd.lab.bench.client import tpot
from sglang_pdd.lab.bench.metrics import RequestRecord, WanBytes, summarize
from sglang_pdd.lab.bench.presets import get_preset
from sglang_pdd.lab.bench.report import markdown_table, text_table, write_reports
from sglang_pdd.lab.bench.runner import BenchRun, SystemRun
from sglang_pdd.lab.workload.generator import measured
from sglang_pdd.lab.workload.trace import write_jsonl
from sglang_pdd.lab.sim.calibration import calibrate

MODEL_INFO = {"spec": {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "head_dim": 64,
                       "dtype": "float32"}, "parameters": 12587520, "kv_bytes_per_token": 16384}


def _records(reqs, ttft):
    return [RequestRecord(r.request_id, r.session_id, r.turn, r.input_len, r.hit_rate, sent_s=float(i),
                          ok=True, ttft_s=ttft, e2e_s=ttft + 0.31, tpot_s=tpot(ttft, ttft + 0.31, 32),
                          prompt_tokens=r.input_len, output_tokens=32, cached_tokens=r.prefix_hit_len)
            for i, r in enumerate(reqs)]


@pytest.fixture
def bench_run(tmp_path):
    preset = get_preset("smoke")
    reqs = preset.requests()
    trace = tmp_path / "trace.jsonl"
    write_jsonl(reqs, trace)
    runs = []
    for name, sim, ttft, wan in (("same-dc", "same-dc-pd", 0.5, 0), ("cross-dc", "xdc-pd-naive", 4.0, 30 << 20)):
        recs = _records(measured(reqs), ttft)
        w = WanBytes(wan * len(recs), 0, wan * len(recs))
        runs.append(SystemRun(name, sim, "d", summarize(name, recs, preset.sla, w), recs, w))
    runs.append(SystemRun("cross-dc-drc", "xdc-pd-drc", "d", None, error="RuntimeError: boom"))
    link = {"delay_ms": 20.0, "rate_mbit": 100.0}
    return BenchRun(preset, str(trace), "model", MODEL_INFO, runs, 12.0, link)


def test_table_has_one_row_per_measured_system(bench_run):
    md = markdown_table([s.summary for s in bench_run.systems if s.summary])
    lines = md.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| same-dc |") and lines[3].startswith("| cross-dc |")
    assert "| 4.00 |" in lines[3]  # TTFT P50 of cross-dc
    assert "30.00" in lines[3]  # 30 MiB of KV per request
    assert "cross-dc" in text_table([s.summary for s in bench_run.systems if s.summary])


def test_reports_are_written_and_failures_named(bench_run, tmp_path):
    out = tmp_path / "out"
    paths = write_reports(bench_run, str(out))
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["systems"]) == {"same-dc", "cross-dc", "cross-dc-drc"}
    assert rep["systems"]["cross-dc"]["summary"]["ttft_p50_s"] == pytest.approx(4.0)
    assert rep["systems"]["cross-dc-drc"]["error"].startswith("RuntimeError")
    assert len(rep["systems"]["same-dc"]["requests"]) == len(bench_run.systems[0].records)
    assert "cross-dc-drc` failed" in (out / "report.md").read_text()
    assert "calibration-same-dc" in paths and "calibration-cross-dc-drc" not in paths


def test_calibration_files_are_read_by_the_simulator(bench_run, tmp_path):
    write_reports(bench_run, str(tmp_path))
    cal = json.loads((tmp_path / "calibration-cross-dc.json").read_text())
    assert cal["system"] == "xdc-pd-naive" and cal["closed_loop"] is True
    assert cal["wan"] == {"bandwidth_gbps": pytest.approx(0.1), "rtt_s": pytest.approx(0.04), "jitter": 0.0}
    c = calibrate(cal)
    assert c.matched == len(cal["requests"]) and c.measured_only == 0
    assert c.rows[0][2] == "4.000"  # the measured TTFT P50 column


def test_plots_are_written_for_every_figure(bench_run, tmp_path):
    pytest.importorskip("matplotlib")
    from sglang_pdd.lab.bench.plots import write_plots

    paths = write_plots(bench_run, str(tmp_path))
    assert set(paths) == {"ttft_cdf", "wan_bytes", "hit_rate"}
    for p in paths.values():
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
