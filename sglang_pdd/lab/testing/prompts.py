"""Deterministic prompts of exact token lengths for the tiny model (tests, demo, examples)."""

from __future__ import annotations

import random

from sglang_pdd.lab.testing.tiny_model import _corpus


class PromptMaker:
    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def ids(self, n_tokens: int, seed: int) -> list[int]:
        """Token IDs of natural-looking text, exactly `n_tokens` long (different seeds differ)."""
        rng = random.Random(seed)
        lines = _corpus(seed + 1000, lines=64)
        ids: list[int] = []
        while len(ids) < n_tokens:
            ids += self.tokenizer.encode(" ".join(rng.sample(lines, 8)) + "\n", add_special_tokens=False)
        return ids[:n_tokens]

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
