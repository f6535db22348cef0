"""The bench's --trace (slice and scale a recorded trace) and --base-url (a running deployment) options:
what is refused at start-up, what a slice keeps, the report's workload and hit-rate histogram, and the
OpenAI client's reading of a stream."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_pdd.lab.bench.__main__ import main
from sglang_pdd.lab.bench.client import StreamResult, greedy_request
from sglang_pdd.lab.bench.live import LiveServerError, LiveTarget
from sglang_pdd.lab.bench.metrics import RequestRecord, WanBytes, summarize
from sglang_pdd.lab.bench.openai_client import completion_body, stream_completion
from sglang_pdd.lab.bench.presets import get_preset, with_trace
from sglang_pdd.lab.bench.replay import replay
from sglang_pdd.lab.bench.report import report_dict, text_table
from sglang_pdd.lab.bench.runner import BenchRun, SystemRun
from sglang_pdd.lab.bench.trace_workload import TraceSlice
from sglang_pdd.lab.workload.generator import generate
from sglang_pdd.lab.workload.mooncake import MooncakeOptions
from sglang_pdd.lab.workload.trace import write_jsonl
from sglang_pdd.lab.sim.presets import tiny_workload


def _mooncake(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


@pytest.fixture
def trace(tmp_path):
    # 6 records, 1 s apart; records 2 and 4 share record 0's first two blocks
    recs = [{"timestamp": 1000 * i, "input_length": 1024 + 100, "output_length": 40,
             "hash_ids": [0, 1, 100 + i] if i in (0, 2, 4) else [10 * i, 10 * i + 1, 10 * i + 2]} for i in range(6)]
    return _mooncake(tmp_path / "mc.jsonl", recs)


@pytest.fixture(autouse=True)
def no_run(monkeypatch):
    """An option check that lets a command through must fail here, not start a testbed or a client."""
    import sglang_pdd.lab.bench.__main__ as cli

    def refuse(*a, **kw):
        raise AssertionError("the command line was not refused at start-up")

    monkeypatch.setattr(cli, "run_bench", refuse)
    monkeypatch.setattr(cli, "run_live", refuse)


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (["--trace-from", "5"], "--trace-from need --trace"),
    (["--trace-requests", "3"], "--trace-requests need --trace"),
    (["--api", "openai"], "--api need --base-url"),
    (["--api-key", "k"], "--api-key need --base-url"),
    (["--base-url", "http://127.0.0.1:1", "--systems", "pdd"], "--systems apply to the testbed"),
    (["--base-url", "http://127.0.0.1:1", "--repeat", "2"], "--repeat apply to the testbed"),
    (["--base-url", "http://127.0.0.1:1", "--placement", "per-dc"], "--placement apply to the testbed"),
    (["--ttft-sla", "0"], "--ttft-sla and --tpot-sla must be > 0"),
])
def test_options_that_do_not_apply_are_refused_naming_the_flag(capsys, argv, named):
    assert named in _refused(capsys, argv)


def test_trace_options_are_checked_and_the_trace_read_at_start_up(capsys, trace, tmp_path):
    assert "--trace-*: length_scale" in _refused(capsys, ["--trace", trace, "--trace-length-scale", "2"])
    assert "--trace-requests must be >= 1" in _refused(capsys, ["--trace", trace, "--trace-requests", "0"])
    assert "no record left" in _refused(capsys, ["--trace", trace, "--trace-from", "100"])
    assert "No such file" in _refused(capsys, ["--trace", str(tmp_path / "missing.jsonl")])
    ours = tmp_path / "ours.jsonl"
    write_jsonl(generate(tiny_workload(duration_s=10.0)), ours)
    err = _refused(capsys, ["--trace", str(ours), "--trace-length-scale", "0.5"])
    assert "apply to Mooncake-format traces only" in err


def test_base_url_refuses_an_unknown_api_and_a_bad_url():
    with pytest.raises(ValueError, match="--api"):
        LiveTarget("http://x", api="grpc")
    with pytest.raises(ValueError, match="--base-url"):
        LiveTarget("localhost:30000")


def test_a_slice_is_cut_scaled_and_shifted_and_says_so(trace):
    ts = TraceSlice(trace, MooncakeOptions(start_s=2.0, speedup=2.0, length_scale=0.5), max_requests=3, output_cap=15)
    reqs = [r for r in ts.requests() if not r.warmup]
    assert [r.request_id for r in reqs] == ["mc3", "mc4", "mc5"]  # records 2-4 (lines 3-5): window from 2 s, first 3
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 1.0]  # shifted to 0, 2x faster
    assert all(r.input_len == 256 * 2 + 50 and r.block_tokens == 256 for r in reqs)  # lengths x0.5
    assert all(r.max_output_tokens == 15 for r in reqs)  # 40 x 0.5 = 20, capped at 15
    assert [r.prefix_hit_len for r in reqs] == [512, 0, 512]  # records 2 and 4 share record 0's two blocks
    a, b = reqs[0].token_ids(2048), reqs[2].token_ids(2048)
    assert a[:512] == b[:512] and a[512:] != b[512:]  # shared blocks are the same tokens
    text = ts.describe()
    for part in ("window 2-end s", "compressed x2", "lengths x0.5", "the first 3 of them kept",
                 "outputs capped at 15 tokens", "over 1 s"):
        assert part in text


def test_a_window_after_the_start_warms_the_caches_with_the_history_before_it(trace):
    window = TraceSlice(trace, MooncakeOptions(start_s=2.0, length_scale=0.5)).requests()
    warm = [r for r in window if r.warmup]
    assert [r.request_id for r in warm] == ["mc3-warm-up", "mc5-warm-up"]  # the two with a hit
    by_id = {r.request_id: r for r in window}
    for w in warm:
        whole = by_id[w.request_id.removesuffix("-warm-up")]
        assert w.input_len == whole.prefix_hit_len == 512 and w.session_id == whole.session_id
        assert w.token_ids(2048) == whole.token_ids(2048)[:512]  # the prefix the trace saw before
    # from the trace's start there is no history: no warm-up, record 2's hit is only what the window saw
    assert not any(r.warmup for r in TraceSlice(trace, MooncakeOptions(length_scale=0.5)).requests())
    assert "2 warm-ups hold the prefixes seen before the window" in TraceSlice(
        trace, MooncakeOptions(start_s=2.0, length_scale=0.5)).describe()


def test_a_whole_trace_is_kept_without_a_cut(trace):
    ts = TraceSlice(trace)
    assert len(ts.requests()) == 6 and "of them kept" not in ts.describe()


def test_a_benchmark_trace_replays_as_written(tmp_path):
    reqs = get_preset("smoke").requests()
    path = tmp_path / "smoke.jsonl"
    write_jsonl(reqs, path)
    again = TraceSlice(str(path)).requests()
    assert [r.request_id for r in again] == [r.request_id for r in reqs]
    assert [r.token_ids(2048) for r in again if r.turn == 1] == [r.token_ids(2048) for r in reqs if r.turn == 1]


def _run(preset, records, link=True):
    wan = WanBytes(100, 100, None)
    s = SystemRun("live-native", "", "d", summarize("live-native", records, preset.sla, wan, link_counted=link),
                  records, wan, label="live-native")
    return BenchRun(preset, "trace.jsonl", "", {}, [s], 1.0, client="test client")


def _records(reqs, cached):
    return [RequestRecord(r.request_id, r.session_id, r.turn, r.input_len, r.hit_rate, 0.1 * i, True, 0.2, 0.5,
                          0.01, r.input_len, 4, int(cached * r.input_len)) for i, r in enumerate(reqs)]


def test_the_report_says_what_was_replayed_and_gives_the_hit_histogram(trace):
    preset = with_trace(get_preset("smoke"), TraceSlice(trace, MooncakeOptions(length_scale=0.5), max_requests=5))
    assert preset.name == "trace-mc" and preset.sla == get_preset("smoke").sla
    reqs = preset.requests()
    rep = report_dict(_run(preset, _records(reqs, 0.97), link=False))
    w = rep["workload"]
    assert w["trace"] == "mc" and w["max_requests"] == 5 and w["options"]["length_scale"] == 0.5
    assert w["options"]["block_tokens"] == 256 and "lengths x0.5" in w["description"]
    h = rep["hit_histogram"]
    assert h["buckets"][-1] == ">=95%"
    assert h["workload"] == pytest.approx([0.6, 0.0, 0.0, 0.4, 0.0])  # records 2 and 4 hit 512/562: 91 %
    assert h["systems"]["live-native"] == pytest.approx([0, 0, 0, 0, 1.0])
    assert rep["client"] == "test client"
    s = rep["systems"]["live-native"]["summary"]
    assert s["wan_bytes_per_request"] is None and s["ttft_p50_s"] == pytest.approx(0.2)


def test_an_uncounted_link_shows_as_not_available():
    preset = get_preset("smoke")
    recs = _records(preset.requests()[:3], 0.5)
    counted = summarize("a", recs, preset.sla, WanBytes(300, 300, None))
    live = summarize("b", recs, preset.sla, WanBytes(0, 0, None), link_counted=False)
    assert counted.wan_bytes_per_request == pytest.approx(200.0) and live.wan_bytes_per_request is None
    row_b = text_table([counted, live]).splitlines()[2]
    assert "n/a" in row_b


# --- the OpenAI client against a canned stream ------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    chunks: list = []
    seen: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer sk-1":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"data": [{"id": "served-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        type(self).seen.append((self.path, self.headers.get("Authorization"), json.loads(self.rfile.read(n))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for c in type(self).chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server():
    _Handler.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_completion_body_is_the_greedy_request_with_a_token_id_prompt():
    b = completion_body(greedy_request([5, 6, 7], 9), "m")
    assert b["prompt"] == [5, 6, 7] and b["max_tokens"] == 9 and b["temperature"] == 0.0 and b["ignore_eos"]
    assert b["stream"] and b["stream_options"] == {"include_usage": True} and b["return_token_ids"]


def test_stream_completion_reads_ids_usage_and_cached_tokens(server):
    _Handler.chunks = [{"choices": [{"index": 0, "text": "a", "token_ids": [40]}]},
                       {"choices": [{"index": 0, "text": "b", "token_ids": [41], "finish_reason": "length"}]},
                       {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                 "prompt_tokens_details": {"cached_tokens": 2}}}]
    res = stream_completion(server, greedy_request([5, 6, 7], 2), 10.0, {"Authorization": "Bearer sk-1"}, "m")
    assert res.ok and res.ttft_s is not None and res.e2e_s >= res.ttft_s
    assert res.output_ids == [40, 41] and res.output_tokens == 2 and res.cached_tokens == 2
    assert res.prompt_tokens == 3 and res.finish_reason == {"type": "length"}
    path, auth, body = _Handler.seen[0]
    assert path == "/v1/completions" and auth == "Bearer sk-1" and body["model"] == "m"


def test_stream_completion_without_ids_counts_usage_and_reports_errors(server):
    _Handler.chunks = [{"choices": [{"index": 0, "text": "x"}]}, {"choices": [], "usage": {"completion_tokens": 5}}]
    res = stream_completion(server, greedy_request([1, 2], 5))
    assert res.ok and res.output_tokens == 5 and res.output_ids == [] and res.prompt_tokens == 2
    _Handler.chunks = [{"error": {"message": "prompt too long", "code": 400}}]
    res = stream_completion(server, greedy_request([1, 2], 5))
    assert not res.ok and res.error == "prompt too long"
    _Handler.chunks = []
    assert "empty stream" in stream_completion(server, greedy_request([1], 1)).error


def test_the_live_probe_names_the_model_and_refuses_clearly(server):
    t = LiveTarget(server, "openai", api_key="sk-1")
    t.probe()
    assert t.model == "served-model"
    with pytest.raises(LiveServerError, match="give --api-key"):
        LiveTarget(server, "openai").probe()
    with pytest.raises(LiveServerError, match="unreachable"):
        LiveTarget("http://127.0.0.1:1", "native").probe()


def test_a_session_thread_starts_at_its_arrival_not_with_the_whole_trace():
    base = [r for r in get_preset("smoke").requests() if not r.warmup and r.turn == 1][0]
    reqs = [replace(base, request_id=f"r{i}", session_id=i, arrival_s=0.3 * i) for i in range(4)]
    alive_at_first_send = []

    def send(body, timeout_s):
        if not alive_at_first_send:
            alive_at_first_send.append(sorted(t.name for t in threading.enumerate() if t.name.startswith("session-")))
        return StreamResult(True, ttft_s=0.01, e2e_s=0.02, prompt_tokens=1, output_tokens=2, output_ids=[20, 21])

    recs = replay(send, reqs, 2048, timeout_s=5.0)
    assert [r.request_id for r in recs] == ["r0", "r1", "r2", "r3"] and all(r.ok for r in recs)
    assert alive_at_first_send == [["session-0"]]  # the later sessions' threads do not exist yet


def test_a_live_run_plots_ttft_and_hits_but_no_uncounted_link(tmp_path):
    pytest.importorskip("matplotlib")
    from sglang_pdd.lab.bench.plots import write_plots

    preset = get_preset("smoke")
    paths = write_plots(_run(preset, _records(preset.requests()[:4], 0.5), link=False), str(tmp_path))
    assert sorted(paths) == ["hit_rate", "ttft_cdf"] and all((tmp_path / f"{k}.png").exists() for k in paths)
