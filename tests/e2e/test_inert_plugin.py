"""With sglang-pdd installed but no --pdd-role, a server is plain sglang: greedy output equals HF's (the
reference server also runs --pdd-seeded-sampling on, which greedy requests never see)."""

import pytest

from sglang_pdd.testing.client import greedy_ids

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
