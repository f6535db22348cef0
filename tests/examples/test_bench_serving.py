"""sglang's own benchmark (`python -m sglang.bench_serving`) against the PDD router, offline: the router
started as docs/bench.md says (`python -m sglang_pdd.router`) in front of fake P/RLD/MD roles, the
tiny model's tokenizer, and the two shipped workloads (examples/bench-serving): `--dataset-name random`
on the ShareGPT-format file (no prompt shares a prefix with an earlier one) and `--dataset-name mooncake`
on the Mooncake-format trace (each session's turn resends the previous turn's context: what P sends
shows it). Every request must succeed and carry its output tokens across the handoff."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import ServerProcess, free_port

from .conftest import EXAMPLES, REPO
from .fake_router import running_roles

HERE = os.path.join(EXAMPLES, "bench-serving")
DATASET = os.path.join(HERE, "sharegpt-offline.json")
TRACE = os.path.join(HERE, "mooncake-agentic.jsonl")
PROMPTS, OUTPUT_LEN = 6, 12
TRACE_PROMPTS = 12


def env() -> dict:
    e = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    e.pop("SGLANG_IS_IN_CI", None)  # would make bench_serving POST /flush_cache, which the router lacks
    e["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, e.get("PYTHONPATH")) if p)
    return e


def test_the_shipped_dataset_is_what_its_generator_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serving_make_dataset", os.path.join(HERE, "make_dataset.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(DATASET) as f:
        assert f.read() == mod.render(mod.dataset())


def test_the_shipped_trace_is_what_its_generator_writes_and_is_prefix_heavy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serving_make_trace", os.path.join(HERE, "make_trace.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(TRACE) as f:
        text = f.read()
    assert text == mod.render(mod.trace())
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    assert all(r["input_length"] == 512 * len(r["hash_ids"]) and r["output_length"] > 0 for r in rows)
    # most requests resend a prefix an earlier request sent (in blocks): what `random` never does
    resent = [max((_common(r["hash_ids"], e["hash_ids"]) for e in rows[:i]), default=0) / len(r["hash_ids"])
              for i, r in enumerate(rows)]
    assert sum(x >= 0.5 for x in resent) >= len(rows) * 0.7, resent


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _resent_share(bodies: list[dict]) -> list[float]:
    """Per request P got, the share of its prompt tokens an earlier request already started with."""
    prompts = [b["input_ids"] for b in bodies]
    return [max((_common(p, e) for e in prompts[:i]), default=0) / len(p) for i, p in enumerate(prompts)]


def run_bench(tiny_model, tmp_path, dataset_args: list[str], backend: str = "sglang"):
    """bench_serving against a router (its own process, as documented) in front of fake roles:
    (bench_serving's result, the fake cluster with the bodies each role received, its stdout)."""
    pytest.importorskip("datasets")  # bench_serving imports it; requirements/sglang-cpu.txt pins it
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running_roles() as cl:
        p, rld, md = cl.urls
        router = ServerProcess("router", PddRouterConfig(
            prefill=[(p, 8998)], relay=[(rld, 18500)], main=[md], tokenizer=tiny_model, port=port,
            extra=["--bandwidth-poll-s", "0", "--log-level", "warning"]), str(tmp_path)).start()
        try:
            router.wait_ready(timeout_s=60)
            out = tmp_path / "bench.jsonl"
            r = subprocess.run(
                [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
                 "--model", tiny_model, "--tokenizer", tiny_model, *dataset_args,
                 "--disable-tqdm", "--output-file", str(out)],
                env=env(), capture_output=True, text=True, timeout=240, cwd=tmp_path)
        finally:
            router.stop()
        assert r.returncode == 0, (f"bench_serving failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}\n"
                                   f"router:\n{router.log_tail()}")
        (result,) = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        assert "Successful requests:" in r.stdout
        return result, cl, r.stdout


def test_bench_serving_runs_offline_against_the_router(tiny_model, tmp_path):
    """The documented `random` command with the `sglang` backend (`sglang-oai` reaches /v1/completions,
    which the router's OpenAI tests cover; each run here costs ~35 s of sglang's import time)."""
    result, cl, stdout = run_bench(tiny_model, tmp_path, [
        "--dataset-name", "random", "--dataset-path", DATASET, "--random-input-len", "64",
        "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1", "--num-prompts", str(PROMPTS),
        "--request-rate", "inf"])
    assert result["completed"] == PROMPTS, stdout[-4000:]
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    # every measured request (and the warm-up) went P->RLD->MD: RLD streamed, MD finished
    assert len(cl.main.bodies) == len(cl.relay.bodies) == PROMPTS + 1
    # `random` never resends a prefix: no measured request starts with much of an earlier one (the
    # warm-up request is the first prompt, sent again)
    shares = _resent_share(cl.prefill.bodies[1:])
    assert len(shares) == PROMPTS and max(shares) < 0.5, shares


def test_bench_serving_replays_the_mooncake_trace_against_the_router(tiny_model, tmp_path):
    """The documented `mooncake` command on the shipped trace (its timestamps compressed 100x): every
    request completes with its trace's output length, and P is sent what makes PDD pay, prompts that
    start with an earlier request's prompt."""
    with open(TRACE) as f:
        rows = [json.loads(line) for line in f][:TRACE_PROMPTS]
    result, cl, stdout = run_bench(tiny_model, tmp_path, [
        "--dataset-name", "mooncake", "--dataset-path", TRACE, "--num-prompts", str(TRACE_PROMPTS),
        "--mooncake-slowdown-factor", "0.01", "--mooncake-num-rounds", "1"])
    assert result["completed"] == TRACE_PROMPTS, stdout[-4000:]
    assert result["total_output_tokens"] == sum(r["output_length"] for r in rows)
    assert len(cl.main.bodies) == len(cl.relay.bodies) == TRACE_PROMPTS + 1  # and the warm-up
    shares = _resent_share(cl.prefill.bodies)[1:]  # after bench_serving's warm-up request
    assert len(shares) == TRACE_PROMPTS
    assert sum(s >= 0.5 for s in shares) >= TRACE_PROMPTS // 2, shares
