"""Reject requests that upstream sglang would crash on, before they reach the scheduler.

Upstream 0.5.23 forwards token IDs unchecked: an ID outside the model's vocabulary raises
`IndexError` inside the embedding and the whole server goes down (SIGQUIT from the scheduler). Here
such a request gets a clear 400 and the server keeps serving. Valid requests are untouched.
"""

from __future__ import annotations

from typing import Sequence


class BadInputError(ValueError):
    """A request that cannot be served; sglang returns it to the client as a 400."""


def check_input_ids(input_ids: Sequence[int] | None, vocab_size: int) -> None:
    if input_ids is None:
        return
    if len(input_ids) == 0:
        raise BadInputError("the prompt is empty: send at least one token (or non-empty text)")
    lo, hi = min(input_ids), max(input_ids)
    if lo < 0 or hi >= vocab_size:
        bad = next(t for t in input_ids if t < 0 or t >= vocab_size)
        raise BadInputError(
            f"token id {bad} is outside the model's vocabulary; valid ids are [0, {vocab_size})"
        )
