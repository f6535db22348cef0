"""Token identity against a single server, with the step and margin of any divergence.

Every pipeline's proof is that its greedy (or seeded) tokens equal a single sglang server's. On the
context-sensitive test model a wrong page, position or slot changes the output within a few steps, so
equality means something; but float reordering (an EXTEND over tokens a single server decoded one by
one, a batch of another size) moves logits by ~1e-4, and a greedy step whose top-2 margin is smaller
than that may legitimately flip. `Reference` keeps the single server's top-2 margin of every step;
`check` fails a divergence with its step, both tokens and that margin, except a *certified near tie*:
the reference's margin there is below `NEAR_TIE` and the pipeline took the reference's own runner-up.
Such a comparison counts as verified up to the tie (the tokens after it legitimately differ), and is
recorded (`NEAR_TIES`, printed at the end of the test session). A real bug almost never lands exactly
on a near tie and on the runner-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pdd.lab.testing.client import generate, greedy_body

NEAR_TIE = 1e-3  # logits; the test model's ordering noise is ~3e-4 at most (model_check)
NEAR_TIES: list[str] = []  # certified near ties met in this process
COMPARED: list[int] = [0, 0]  # [comparisons, tokens verified]


@dataclass
class Reference:
    tokens: list[int]
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logprob per step
    runner_up: list[int] = field(default_factory=list)  # the top-2 token per step
    logprobs: list[float] = field(default_factory=list)  # the chosen token's logprob per step
    text: str = ""

    def __len__(self) -> int:
        return len(self.tokens)


def reference_body(body: dict) -> dict:
    """`body` asking a single server for the two best tokens of every step as well."""
    return {**body, "return_logprob": True, "top_logprobs_num": max(2, int(body.get("top_logprobs_num") or 0)),
            "logprob_start_len": -1}


def from_output(out: dict) -> Reference:
    meta = out["meta_info"]
    tops = meta.get("output_top_logprobs") or []
    margins, runner_up = [], []
    for step in tops:
        best = sorted(((float(lp), int(tid)) for lp, tid, *_ in step), reverse=True)
        margins.append(best[0][0] - best[1][0] if len(best) > 1 else float("inf"))
        runner_up.append(best[1][1] if len(best) > 1 else -1)
    lps = [float(t[0]) for t in meta.get("output_token_logprobs") or []]
    return Reference(list(out["output_ids"]), margins, runner_up, lps, out.get("text", ""))


def reference(url: str, ids: list[int], n: int, **sampling) -> Reference:
    """A single server's greedy tokens for `ids` (and their margins)."""
    return from_output(generate(url, reference_body(greedy_body(ids, n, **sampling))))


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check(ref: Reference, got: list[int], what: str = "", prefix: bool = False) -> int:
    """Assert `got` equals the reference (`prefix`: its first len(got) tokens); return how many tokens
    were verified. A certified near tie ends the comparison there (see the module docstring)."""
    want = ref.tokens[: len(got)] if prefix else ref.tokens
    i = first_divergence(want, got)
    COMPARED[0] += 1
    if i is None:
        COMPARED[1] += len(got)
        return len(got)
    if i < min(len(want), len(got)) and i < len(ref.margins):
        margin = ref.margins[i]
        if margin < NEAR_TIE and got[i] == ref.runner_up[i]:
            NEAR_TIES.append(f"{what or 'comparison'}: near tie at step {i} (margin {margin:.1e}); "
                             f"{i} tokens verified")
            COMPARED[1] += i
            return i
        raise AssertionError(
            f"{what or 'output'} diverges from the single server at step {i} of {len(want)}: got {got[i]}, "
            f"expected {want[i]} (the reference's margin there is {margin:.2e}, its runner-up {ref.runner_up[i]}; "
            f"not a near tie)\n  got      {got[max(0, i - 3):i + 5]}\n  expected {want[max(0, i - 3):i + 5]}")
    raise AssertionError(f"{what or 'output'}: {len(got)} tokens where the single server gave {len(want)}"
                         + (f" (first {i} equal)" if i else ""))


def summary() -> list[str]:
    lines = [f"token identity: {COMPARED[0]} comparisons, {COMPARED[1]} tokens verified, "
             f"{len(NEAR_TIES)} ended at a certified near tie (margin < {NEAR_TIE:g})"]
    return lines + NEAR_TIES
