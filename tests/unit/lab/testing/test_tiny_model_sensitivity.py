"""The test model's contract, measured on transformers (no sglang): its greedy output depends on the
whole context, and float reordering cannot flip it. Every e2e identity test stands on this."""

import json
import os

from sglang_pdd.lab.testing import model_check
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build


def test_every_greedy_token_depends_on_the_context_and_not_on_rounding(tiny_model, figures):
    with open(os.path.join(tiny_model, "sglang_pdd_tiny_model.json")) as f:
        info = json.load(f)
    model = model_check.load(tiny_model)
    ids = list(range(model_check.FIRST_ID, model_check.FIRST_ID + 300))
    assert not model_check.diverges(model, ids, model_check.greedy(model, ids, 16).tokens)  # a change counts, not noise
    fig = model_check.measure(model, trials=16)  # `python -m sglang_pdd.lab.testing.model_check` runs 40
    figures.append(f"test model: {info['parameters'] / 1e6:.1f}M parameters, "
                   f"{info['kv_bytes_per_token'] / 1024:.0f} KiB KV/token, built in {info.get('build_s', '?')}s")
    figures += [f"test model: {line}" for line in fig.lines()]
    assert fig.failures() == []
    assert info.get("build_s", 0) < 180


def test_the_random_init_model_fails_the_contract(tmp_path):
    """Negative control: the earlier random-weight model repeats one token, and the check says so."""
    d = str(tmp_path / "random")
    build(d, TinyModelSpec(weights="random"))
    fig = model_check.measure(model_check.load(d), trials=0, noise=False, lengths=(7, 150, 600))
    assert any("distinct" in f or "repeated" in f for f in fig.failures()), fig.lines()
