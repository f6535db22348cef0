"""The MLA test model (`tiny_model --arch mla`, DeepSeek-V3 architecture) on one real sglang CPU server:
its greedy tokens equal transformers'. sglang runs it with the `intel_amx` attention backend, whose ops
are the compat stand-in's torch versions (sglang_pdd.lab.compat.amx_attention); the MLA KV pool is
sglang's own (`MLATokenToKVPool`). No PDD role here: test_mla_pdd.py and test_mla_packed_wan.py run the
PDD roles on it."""

import pytest

from sglang_pdd.lab.testing import tiny_mla
from sglang_pdd.lab.testing.client import greedy_ids

pytestmark = pytest.mark.e2e

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def mla_server(mla_reference):
    """The session's single MLA server (chunked prefill of 256; its seeded sampler leaves greedy alone)."""
    return mla_reference


def hf_greedy(model_dir: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    import torch

    model = tiny_mla.load(model_dir)
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                               min_new_tokens=n, pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out


def test_mla_server_greedy_equals_transformers(mla_server, mla_model, figures):
    from sglang_pdd.lab.testing.prompts import PromptMaker

    pm = PromptMaker(mla_model)
    # 5 and 200 tokens: one EXTEND without prefix (sglang's MHA path of an MLA model); 700: chunks of 256,
    # the later ones over the cached latent rows (the absorbed MLA path); every decode step: latent reads.
    cases = [pm.ids(5, seed=1), pm.ids(200, seed=2), pm.ids(700, seed=3)]
    expected = hf_greedy(mla_model, cases, NEW_TOKENS)
    got = [greedy_ids(mla_server.url, ids, NEW_TOKENS) for ids in cases]
    assert got == expected
    assert all(len(set(g)) > NEW_TOKENS // 2 for g in got), "outputs must depend on their context"
    # The same long prompt again: its prefix comes from the radix cache (latent rows written by the first run).
    assert greedy_ids(mla_server.url, cases[2], NEW_TOKENS) == expected[2]
    log = mla_server.log_text()
    assert "'attention_backend': 'intel_amx'" in log
    figures.append(f"MLA test model on sglang ({tiny_mla.ATTENTION_BACKEND}, stand-in ops): "
                   f"{len(cases) + 1} prompts x {NEW_TOKENS} greedy tokens identical to transformers")
