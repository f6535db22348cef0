"""With sglang-pdd installed but no --pdd-role, a server is plain sglang: greedy output equals HF's (the
reference server also runs --pdd-seeded-sampling on, which greedy requests never see)."""

import pytest

from sglang_pdd.lab.testing.client import greedy_ids

pytestmark = pytest.mark.e2e

NEW_TOKENS = 24


def hf_greedy(model_dir: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                               min_new_tokens=n, pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out


def test_single_server_greedy_equals_transformers(reference_server, tiny_model, prompts):
    cases = [prompts.ids(5, seed=1), prompts.ids(300, seed=2), prompts.ids(1000, seed=3)]
    expected = hf_greedy(tiny_model, cases, NEW_TOKENS)
    got = [greedy_ids(reference_server.url, ids, NEW_TOKENS) for ids in cases]
    assert got == expected
    assert len({tuple(g) for g in got}) == len(got), "prompts must give distinct outputs to prove anything"


def test_plugin_loaded_without_role_says_so(reference_server):
    lines = [l for l in reference_server.log_text().splitlines() if "sglang-pdd" in l]
    assert any("role=none" in l for l in lines), lines


ENGINE = r'''
import json, sys
import sglang_pdd
engine = sglang_pdd.Engine(
    model_path=sys.argv[1], tokenizer_path=sys.argv[1], port=31990, nccl_port=31991, device="cpu",
    attention_backend="torch_native", sampling_backend="pytorch", dtype="float32", max_total_tokens=16384,
    mem_fraction_static=0.3, max_running_requests=8, chunked_prefill_size=-1, disable_cuda_graph=True,
    grammar_backend="xgrammar", disable_overlap_schedule=True, pdd_seeded_sampling="on")
try:
    out = engine.generate(input_ids=json.loads(sys.argv[2]), sampling_params=json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(out["output_ids"]), flush=True)
finally:
    engine.shutdown()
'''


def test_the_engine_api_takes_the_plugins_options(reference_server, tiny_model, prompts):
    """sglang_pdd.Engine(pdd_seeded_sampling="on"): the option reaches the engine's scheduler, whose seeded
    sample is the reference server's (started with --pdd-seeded-sampling on); another seed differs."""
    import json
    import os
    import subprocess
    import sys

    from sglang_pdd.lab.testing.client import generate
    from sglang_pdd.lab.testing.launch_args import CPU_ENV

    ids = prompts.ids(200, seed=4)
    sp = {"max_new_tokens": NEW_TOKENS, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 77}
    r = subprocess.run([sys.executable, "-c", ENGINE, tiny_model, json.dumps(ids), json.dumps(sp)],
                       env={**os.environ, **CPU_ENV}, capture_output=True, text=True, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    got = json.loads(lines[-1][7:])
    want = generate(reference_server.url, {"input_ids": ids, "sampling_params": sp})["output_ids"]
    other = generate(reference_server.url, {"input_ids": ids, "sampling_params": {**sp, "sampling_seed": 78}})
    assert got == want
    assert other["output_ids"] != want  # the control: the seed decides the sample
