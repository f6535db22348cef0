"""`python -m sglang_pdd.lab.bench --base-url`: a slice of the shipped Mooncake trace sent to a running
sglang server (the session's reference server: no server of its own), over the native and the OpenAI
API, and the report it writes."""

import json
import os
import subprocess
import sys

import pytest

import sglang_pdd.lab.workload as workload

pytestmark = pytest.mark.e2e

TRACE = os.path.join(os.path.dirname(workload.__file__), "traces", "mooncake-synthetic.jsonl.xz")
N = 5


@pytest.mark.parametrize("api", ["native", "openai"])
def test_bench_replays_a_trace_slice_against_a_running_server(reference_server, tmp_path, api):
    out = tmp_path / api
    cmd = [sys.executable, "-m", "sglang_pdd.lab.bench", "--base-url", reference_server.url, "--api", api,
           "--trace", TRACE, "--trace-length-scale", "0.05", "--trace-max-context", "1024", "--trace-requests", str(N),
           "--trace-max-output", "6", "--trace-speedup", "4", "--out", str(out), "--no-plots", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["preset"] == "trace-mooncake-synthetic" and rep["workload"]["max_requests"] == N
    assert rep["workload"]["options"]["length_scale"] == 0.05 and "lengths x0.05" in rep["workload"]["description"]
    label = f"live-{api}"
    s = rep["systems"][label]
    reqs = s["requests"]
    assert len(reqs) == N and all(r["ok"] for r in reqs), [r["error"] for r in reqs]
    assert all(r["output_tokens"] == min(6, r["output_tokens"]) and r["output_tokens"] >= 1 for r in reqs)
    summary = s["summary"]
    assert summary["requests"] == N and summary["failed"] == 0
    for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"):
        assert summary[k] is not None and summary[k] > 0, k
    assert summary["tpot_p50_s"] is not None and summary["tpot_p50_s"] >= 0  # 0 when outputs are 1 token
    assert summary["wan_bytes_per_request"] is None  # not our link: not counted
    h = rep["hit_histogram"]
    assert len(h["workload"]) == len(h["buckets"]) == 5 and sum(h["workload"]) == pytest.approx(1.0)
    assert sum(h["systems"][label]) == pytest.approx(1.0)
    md = (out / "report.md").read_text()
    assert "Prefix hit per request" in md and label in md
