"""Which prompt positions a decoder reads (context_model.prompt_positions_read): a negative control that
withholds a page of KV from a decoder can fail only if its decode steps read that page. Pinned against
the test model on transformers: zeroing an unread page leaves the greedy tokens unchanged, zeroing a
read one changes them."""

import pytest

from sglang_pdd.lab.testing import model_check
from sglang_pdd.lab.testing.context_model import prompt_positions_read
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec

SPEC = TinyModelSpec()
STEPS = 15  # a decode leg of 16 new tokens: the prefill gave the first


def reads(prompt_len: int) -> set[int]:
    return prompt_positions_read(prompt_len, STEPS, SPEC.layers, SPEC.heads)


def test_reads_are_the_heads_distances_back_from_each_decode_step():
    got = reads(150)
    assert got == {p for q in range(150, 165) for d in (*range(0, 64, 8), 85) if (p := q - d) < 150}
    assert not any(p < 64 for p in got)  # page 0 of 64: no decode step reads it (171 > 150: a head reads itself)
    assert set(range(21, 36)) <= reads(192)  # distance 171 reaches page 0
    assert set(range(16)) <= reads(48)  # layer 0 reads page 0 of 16


def greedy_with_zeroed_kv(model, ids: list[int], lo: int, hi: int) -> list[int]:
    """Prefill the whole prompt and take its first token (as P does), zero the KV of positions [lo, hi)
    in every layer, then decode STEPS tokens from that cache (as a decoder missing those slots does)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        cache = out.past_key_values
        for layer in cache.layers:
            layer.keys[:, :, lo:hi] = 0
            layer.values[:, :, lo:hi] = 0
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(STEPS):
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@pytest.mark.parametrize("prompt_len, page, read", [(150, 0, False), (192, 0, True), (448, 3, True)])
def test_a_missing_page_changes_the_output_exactly_when_it_is_read(tiny_model, prompts, prompt_len, page, read):
    model = model_check.load(tiny_model)
    ids = prompts.ids(prompt_len, seed=910)
    lo, hi = page * 64, min((page + 1) * 64, prompt_len)
    assert bool(set(range(lo, hi)) & reads(prompt_len)) == read
    want = model_check.greedy(model, ids, STEPS + 1).tokens
    assert (greedy_with_zeroed_kv(model, ids, lo, hi) != want) == read
