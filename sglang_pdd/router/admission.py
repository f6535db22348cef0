"""What the router accepts from a client, before any role sees it.

A client error is a 400 with a message here, not a 502 from whichever role trips over it first:
`sampling_params` must be an object of known keys with values of the right type and range (sglang's
own `SamplingParams.verify` ranges), the prompt must be token IDs of the model's vocabulary and fit
its context with the requested output.

The router owns the PDD parameters (`custom_params.pdd`, see `protocol.request`): whatever a client
put there is dropped before the router adds its own, on every endpoint (`without_internal`). The
other internal keys of a role's body (bootstrap host/port/room, rid) are never copied from a client's
body: the dispatcher builds each role's body from the prompt and the sampling parameters only.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from sglang_pdd.protocol.request import KEY as PDD_KEY


class BadRequest(ValueError):
    """A client error: the router answers 400 with this message."""


# sglang 0.5.23's SamplingParams API fields (sglang raises TypeError, a 500, on any other key)
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark",
})

# name -> (lowest, highest, lowest allowed, highest allowed), as sglang's verify
_RANGES = {
    "temperature": (0.0, math.inf, True, False),
    "top_p": (0.0, 1.0, False, True),
    "min_p": (0.0, 1.0, True, True),
    "frequency_penalty": (-2.0, 2.0, True, True),
    "presence_penalty": (-2.0, 2.0, True, True),
    "repetition_penalty": (0.0, 2.0, False, True),
}
_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int | None = None  # token IDs must be below this
    context_len: int | None = None  # prompt + output tokens at most this

    @classmethod
    def from_model_dir(cls, path: str, context_len: int | None = None) -> "ModelLimits":
        """From the model's config.json (vocab_size, max_position_embeddings); unknown where absent.
        `context_len` overrides (a server started with --context-length)."""
        try:
            with open(os.path.join(path, "config.json")) as f:
                c = json.load(f)
        except (OSError, ValueError):
            c = {}
        c = c.get("text_config", c) if isinstance(c.get("text_config"), dict) else c
        return cls(vocab_size=c.get("vocab_size"), context_len=context_len or c.get("max_position_embeddings"))


def without_internal(sampling_params: dict) -> dict:
    """A copy without the PDD parameters a client may have set (the router sets its own)."""
    sp = dict(sampling_params)
    custom = sp.get("custom_params")
    if isinstance(custom, dict) and PDD_KEY in custom:
        custom = {k: v for k, v in custom.items() if k != PDD_KEY}
        if custom:
            sp["custom_params"] = custom
        else:
            del sp["custom_params"]
    return sp


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_sampling(sp, limits: ModelLimits, name: str = "sampling_params") -> dict:
    """`sp` checked (types and ranges); raises BadRequest. Returns it unchanged."""
    if not isinstance(sp, dict):
        raise BadRequest(f"{name} must be a JSON object")
    unknown = sorted(set(sp) - SAMPLING_KEYS)
    if unknown:
        raise BadRequest(f"{name}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
    mx = sp.get("max_new_tokens")
    if mx is not None and (not _is_int(mx) or mx < 1):
        raise BadRequest(f"max_new_tokens must be a positive integer, got {mx!r}")
    mn = sp.get("min_new_tokens")
    if mn is not None and (not _is_int(mn) or mn < 0 or (mx is not None and mn > mx)):
        raise BadRequest(f"min_new_tokens must be an integer in [0, max_new_tokens], got {mn!r}")
    for key, (lo, hi, lo_ok, hi_ok) in _RANGES.items():
        v = sp.get(key)
        if v is None:
            continue
        if not _is_number(v) or not math.isfinite(v) or not (lo <= v if lo_ok else lo < v) \
                or not (v <= hi if hi_ok else v < hi):
            raise BadRequest(f"{key} must be a number in {'[' if lo_ok else '('}{lo:g}, {hi:g}"
                             f"{']' if hi_ok else ')'}, got {v!r}")
    k = sp.get("top_k")
    if k is not None and (not _is_int(k) or (k < 1 and k != -1)):
        raise BadRequest(f"top_k must be -1 (all) or a positive integer, got {k!r}")
    n = sp.get("n")
    if n is not None and n != 1:
        raise BadRequest("n > 1 is not supported")
    for key in _BOOLS:
        if sp.get(key) is not None and not isinstance(sp[key], bool):
            raise BadRequest(f"{key} must be true or false, got {sp[key]!r}")
    seed = sp.get("sampling_seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < 2**63):
        raise BadRequest(f"sampling_seed must be a 64-bit integer, got {seed!r}")
    stop = sp.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("stop must be a string or a list of strings")
    stop_ids = sp.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list):
            raise BadRequest("stop_token_ids must be a list of token ids")
        check_token_ids(stop_ids, limits, "stop_token_ids")
    bias = sp.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(_is_number(v) for v in bias.values()):
            raise BadRequest("logit_bias must map token ids to numbers")
        try:
            check_token_ids([int(t) for t in bias], limits, "logit_bias")
        except ValueError as e:
            raise BadRequest(str(e) if isinstance(e, BadRequest) else "logit_bias keys must be token ids") from None
    custom = sp.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise BadRequest("custom_params must be a JSON object")
    return sp


def check_token_ids(ids: list, limits: ModelLimits, what: str = "input_ids") -> None:
    if not all(_is_int(t) for t in ids):
        raise BadRequest(f"{what} must be integers")
    if not ids:
        return
    lo, hi = min(ids), max(ids)
    if lo < 0 or (limits.vocab_size is not None and hi >= limits.vocab_size):
        bad = lo if lo < 0 else hi
        raise BadRequest(f"{what}: token id {bad} is outside the model's vocabulary"
                         + (f"; valid ids are [0, {limits.vocab_size})" if limits.vocab_size else ""))


def check_prompt(ids: list, max_new_tokens: int, limits: ModelLimits) -> None:
    """The prompt's IDs are in the vocabulary, and prompt + output fit the context (as sglang checks)."""
    check_token_ids(ids, limits)
    ctx = limits.context_len
    if ctx is None:
        return
    if len(ids) >= ctx:
        raise BadRequest(f"the prompt ({len(ids)} tokens) is longer than the model's context length ({ctx} tokens)")
    if len(ids) + max_new_tokens > ctx:
        raise BadRequest(f"the prompt ({len(ids)} tokens) and max new tokens ({max_new_tokens}) exceed the "
                         f"model's context length ({ctx} tokens)")
