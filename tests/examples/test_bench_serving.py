"""sglang's own benchmark (`python -m sglang.bench_serving`) against the PDD router, offline: the router
started as docs/bench.md says (`python -m sglang_pdd.router`) in front of fake P/RLD/MD roles, the
benchmark on the shipped ShareGPT-format file (examples/bench-serving), the tiny model's tokenizer.
Every request must succeed and carry its output tokens across the handoff."""

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
PROMPTS, OUTPUT_LEN = 6, 12


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


def test_bench_serving_runs_offline_against_the_router(tiny_model, tmp_path, backend="sglang"):
    """The documented command's backend (`sglang-oai` reaches /v1/completions, which the router's
    OpenAI tests cover; one run here: each costs ~35 s of sglang's import time)."""
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
                 "--model", tiny_model, "--tokenizer", tiny_model, "--dataset-name", "random",
                 "--dataset-path", DATASET, "--random-input-len", "64", "--random-output-len", str(OUTPUT_LEN),
                 "--random-range-ratio", "1", "--num-prompts", str(PROMPTS), "--request-rate", "inf",
                 "--disable-tqdm", "--output-file", str(out)],
                env=env(), capture_output=True, text=True, timeout=240, cwd=tmp_path)
        finally:
            router.stop()
        assert r.returncode == 0, (f"bench_serving failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}\n"
                                   f"router:\n{router.log_tail()}")
        (result,) = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        assert result["completed"] == PROMPTS, r.stdout[-4000:]
        assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN
        assert "Successful requests:" in r.stdout
        # every measured request (and the warm-up) went P->RLD->MD: RLD streamed, MD finished
        assert len(cl.main.bodies) == len(cl.relay.bodies) == PROMPTS + 1
