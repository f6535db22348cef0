"""The calibration entry point: a report in the documented format is read and compared."""

import json

import pytest

from sglang_pdd.lab.workload.generator import generate
from sglang_pdd.lab.workload.trace import write_jsonl
from sglang_pdd.lab.sim.calibration import calibrate, calibration_report, report_from_records
from sglang_pdd.lab.sim.cli import main
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.presets import TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.sim.wan import WanSpec


@pytest.fixture
def trace_and_report(tmp_path):
    wl = tiny_workload(duration_s=20.0)
    reqs = generate(wl)
    trace = tmp_path / "trace.jsonl"
    write_jsonl(reqs, trace)
    wan = WanSpec(bandwidth_gbps=0.2, rtt_s=0.02, jitter=0.0)
    res = run(tiny_system("pdd-bw", wan=wan), TINY_MODEL, reqs, Sla(2.0, 0.1), wl.duration_s,
              drain_s=3600.0)
    report = report_from_records(res.records, "pdd-bw", str(trace), wan)
    return trace, report


def test_self_calibration_is_exact(trace_and_report):
    _, report = trace_and_report
    c = calibrate(report, window_s=20.0)
    assert c.matched == len(report["requests"]) and c.measured_only == 0
    assert c.ttft_median_abs_err_s == pytest.approx(0.0, abs=1e-9)
    assert c.ttft_median_ratio == pytest.approx(1.0)
    assert "P99" in calibration_report(c)


def test_a_slower_testbed_shows_up_as_a_ratio(trace_and_report):
    _, report = trace_and_report
    for r in report["requests"]:
        r["ttft_s"] *= 2.0
    c = calibrate(report, window_s=20.0)
    assert c.ttft_median_ratio == pytest.approx(2.0)


def test_cli_reads_a_report_file(trace_and_report, tmp_path, capsys):
    trace, report = trace_and_report
    del report["trace"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert main(["--calibrate", str(path), "--trace", str(trace)]) == 0
    assert "TTFT testbed" in capsys.readouterr().out


def test_missing_trace_is_a_clear_error(trace_and_report):
    _, report = trace_and_report
    del report["trace"]
    with pytest.raises(ValueError, match="trace"):
        calibrate(report)


def test_cli_exports_and_replays_a_paper_scale_trace(tmp_path, capsys):
    trace = tmp_path / "paper.jsonl"
    assert main(["--export-trace", str(trace), "--load", "2", "--window", "20"]) == 0
    assert trace.stat().st_size > 0
    assert main(["--scenario", "trace", "--trace", str(trace), "--systems", "xdc-pd-drc,pdd-bw"]) == 0
    out = capsys.readouterr().out
    assert "pdd-bw" in out and "xdc-pd-drc" in out
