"""How much the tiny test model's greedy output says about its context, measured on transformers.

    python -m sglang_pdd.lab.testing.model_check [MODEL_DIR] [--trials 40] [--arch mla]

Three figures back the e2e identity tests (the test model must make a wrong handoff visible):

* **distinct**: distinct token IDs among 64 greedy tokens, on random prompts of 1 to 4000 tokens (a model
  that repeats one token cannot tell a right KV page from a wrong one);
* **sensitivity**: the share of 300-2000-token prompts whose 64-token greedy continuation changes when one
  token at a random position of the first half is replaced (a wrong page far back must show);
* **noise vs margin**: the largest logit difference between orderings of the same computation (whole vs
  chunked prefill, batch of 1 vs 8, EXTEND vs decode steps) against the top-1/top-2 logit margins of the
  greedy steps. A greedy step can flip on float reordering only where its margin is within the noise.

No sglang here: the figures are the model's, not a server's.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

from sglang_pdd.lab.testing.tiny_model import ARCHS, TinyModelSpec, build_cached

LENGTHS = (1, 2, 7, 33, 150, 600, 1200, 2000, 3000, 4000)
FIRST_ID = 7  # IDs below are the tokenizer's special tokens


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit at each step


@dataclass
class Figures:
    distinct: list[int] = field(default_factory=list)  # per prompt of LENGTHS
    changed: int = 0
    trials: int = 0
    noise: dict[str, float] = field(default_factory=dict)  # ordering -> max |logit difference|
    margins: list[float] = field(default_factory=list)  # every greedy step measured
    seconds: float = 0.0

    @property
    def mean_distinct(self) -> float:
        return sum(self.distinct) / max(1, len(self.distinct))

    def margin_quantile(self, q: float) -> float:
        m = sorted(self.margins)
        return m[min(len(m) - 1, int(q * len(m)))] if m else float("nan")

    @property
    def max_noise(self) -> float:
        return max(self.noise.values(), default=0.0)

    def failures(self) -> list[str]:
        """What falls short of the test model's contract (issue 13); empty when it holds."""
        out = []
        if self.mean_distinct < 32:
            out.append(f"mean distinct IDs per 64 tokens {self.mean_distinct:.1f} < 32")
        if self.distinct and min(self.distinct) < 2:
            out.append("an output is one token repeated")
        if self.trials and self.changed < 0.9 * self.trials:
            out.append(f"only {self.changed}/{self.trials} perturbed prompts changed the continuation (< 90 %)")
        if self.margins and self.noise and self.margin_quantile(0.5) < 1000 * self.max_noise:
            out.append(f"median greedy margin {self.margin_quantile(0.5):.2e} is not 1000x the logit noise "
                       f"{self.max_noise:.1e}")
        if self.margins and self.noise and self.margin_quantile(0.01) < 30 * self.max_noise:
            out.append(f"1st-percentile greedy margin {self.margin_quantile(0.01):.2e} is not 30x the logit "
                       f"noise {self.max_noise:.1e}")
        return out

    def lines(self) -> list[str]:
        return [
            f"distinct IDs per 64 greedy tokens (prompts of {', '.join(map(str, LENGTHS))} tokens): "
            f"{self.distinct}, mean {self.mean_distinct:.1f}",
            f"one-token perturbation in the first half changed the continuation: {self.changed}/{self.trials} "
            f"({100 * self.changed / max(1, self.trials):.0f} %)",
            "logit noise between orderings: " + ", ".join(f"{k} {v:.1e}" for k, v in self.noise.items()),
            f"greedy margins (top-1 minus top-2 logit) over {len(self.margins)} steps: min {min(self.margins):.2e}, "
            f"p0.1 {self.margin_quantile(0.001):.2e}, p1 {self.margin_quantile(0.01):.2e}, "
            f"median {self.margin_quantile(0.5):.2f}; steps within 10x the noise: "
            f"{sum(m < 10 * self.max_noise for m in self.margins)}",
            f"measured in {self.seconds:.0f}s",
        ]


def load(model_dir: str):
    """The built model (either architecture) on transformers, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy(model, ids: list[int], n: int) -> Greedy:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        tokens, margins = [], []
        for i in range(n):
            top = torch.topk(out.logits[0, -1], 2)
            margins.append(float(top.values[0] - top.values[1]))
            tokens.append(int(top.indices[0]))
            if i + 1 < n:
                out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return Greedy(tokens, margins)


def diverges(model, ids: list[int], tokens: list[int]) -> bool:
    """Whether greedy decoding of `ids` departs from `tokens` within len(tokens) steps (`greedy`'s
    choice of token, stopping at the first departure: the comparison of two whole continuations at a
    fraction of the cost when they differ early)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for i, t in enumerate(tokens):
            got = int(torch.topk(out.logits[0, -1], 2).indices[0])
            if got != t:
                return True
            if i + 1 < len(tokens):
                out = model(torch.tensor([[got]]), past_key_values=out.past_key_values, use_cache=True)
    return False


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def ordering_noise(model, ids: list[int], g: Greedy, rng: random.Random) -> dict[str, float]:
    """Max |logit difference| of the same positions computed three other ways than prefill + decode."""
    import torch

    n, k = len(ids), len(g.tokens)
    vocab = model.config.vocab_size
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        steps = [out.logits[0, -1]]
        for t in g.tokens[:-1]:
            out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
        decoded = torch.stack(steps)
        extend = model(torch.tensor([ids + g.tokens[:-1]])).logits[0, n - 1:n - 1 + k]
        past = None
        for s in range(0, n, 256):
            out = model(torch.tensor([ids[s:s + 256]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
        chunked = out.logits[0, -1]
        batch = [ids] + [random_ids(rng, vocab, n) for _ in range(7)]
        batched = model(torch.tensor(batch)).logits[0, -1]
    return {"EXTEND vs decode": float((extend - decoded).abs().max()),
            "chunked (256) vs whole prefill": float((chunked - decoded[0]).abs().max()),
            "batch of 8 vs 1": float((batched - decoded[0]).abs().max())}


def measure(model, trials: int = 40, seed: int = 0, n_new: int = 64, noise: bool = True,
            lengths: tuple[int, ...] = LENGTHS) -> Figures:
    t0 = time.monotonic()
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    fig = Figures()
    for n in lengths:
        g = greedy(model, random_ids(rng, vocab, n), n_new)
        fig.distinct.append(len(set(g.tokens)))
        fig.margins += g.margins
    for n in (40, 700, 2000) if noise else ():
        ids = random_ids(rng, vocab, n)
        g = greedy(model, ids, 32)
        for kind, v in ordering_noise(model, ids, g, rng).items():
            fig.noise[kind] = max(fig.noise.get(kind, 0.0), v)
    for _ in range(trials):
        n = rng.randint(300, 2000)
        ids = random_ids(rng, vocab, n)
        j = rng.randrange(n // 2)
        other = list(ids)
        other[j] = FIRST_ID + (ids[j] - FIRST_ID + rng.randrange(1, vocab - FIRST_ID)) % (vocab - FIRST_ID)
        a = greedy(model, ids, n_new)
        fig.margins += a.margins
        fig.trials += 1
        fig.changed += diverges(model, other, a.tokens)
    fig.seconds = time.monotonic() - t0
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testing.model_check", description=__doc__.split("\n")[0])
    p.add_argument("model_dir", nargs="?", help="default: build (or reuse) the default tiny model of --arch under "
                   ".artifacts/")
    p.add_argument("--trials", type=int, default=40, help="one-token perturbations measured (default: 40)")
    p.add_argument("--arch", choices=ARCHS, default="llama",
                   help="without MODEL_DIR: the default tiny model of this architecture (default: llama)")
    args = p.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        model_dir = build_cached(".artifacts/models", TinyModelSpec(arch=args.arch))
    fig = measure(load(model_dir), trials=args.trials)
    for line in fig.lines() + [f"FAILS: {f}" for f in fig.failures()]:
        print(line)
    return 1 if fig.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
