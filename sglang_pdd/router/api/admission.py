"""What the router accepts from a client, before any role sees it.

A client error is a 400 with a message here, not a 502 from whichever role trips over it first:
`sampling_params` must be an object of known keys with values of the right type and range (sglang's
own `SamplingParams.verify` ranges), the prompt must be token IDs of the model's vocabulary and fit
its context with the requested output.

The router owns the PDD parameters (`custom_params.pdd`, see `protocol.request`): whatever a client
put there is dropped before the router adds its own, on every endpoint (`protocol.request.without_internal`, which the dispatcher applies). The
other internal keys of a role's body (bootstrap host/port/room, rid) are never copied from a client's
body: the dispatcher builds each role's body from the prompt and the sampling parameters only.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass



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
_GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")
# Bounds on what a client may ask of a role's scheduler thread (each value is checked there at every
# decode step, or sized into a batch tensor): sglang checks none of these, and some kill a scheduler.
MAX_TOP_K = 2**31 - 1  # top_k goes into an int32 tensor of P's batch: 2**31 overflowed and killed P
MAX_STREAM_INTERVAL = 64  # tokens per streamed chunk: a huge one looks like an idle peer to the router
MAX_STOPS = 16  # stop strings per request (OpenAI allows 4)
MAX_STOP_CHARS = 256  # characters per stop string (checked against the output's tail at every step)
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 100.0  # |bias| at most this (OpenAI's range); finite only
MAX_LOGIT_BIAS_KEYS = 300  # token ids per logit_bias (OpenAI's bound)
MAX_GRAMMAR_CHARS = 1 << 18  # a json_schema / regex / ebnf / structural_tag string
UNSUPPORTED = {
    "stop_regex": "stop_regex is not supported: sglang matches it against the whole output at every decode "
                  "step in the scheduler thread, where one backtracking pattern freezes the server; use stop",
    "watermark": "watermark is not supported through the PDD router",
}


# Body keys the router does not implement yet, refused (400) on every endpoint rather than dropped
# silently. Each entry names the values that mean "not asked for" (those pass). To support one, drop
# its entry here and implement it.
NOT_YET = {
    "logprobs": ((None, False), "logprobs is served on /v1/chat/completions only (a router with sglang "
                                "installed); /generate takes return_logprob"),
    "top_logprobs": ((None, 0), "top_logprobs is served on /v1/chat/completions only (a router with sglang "
                                "installed)"),
    "lora_path": ((None,), "lora_path is not supported by the PDD router (every role serves its base model)"),
}


def check_not_yet(body: dict, lifted: tuple[str, ...] = ()) -> None:
    """`lifted`: keys this endpoint serves (sglang's OpenAI chat layer serves logprobs)."""
    for key, (unset, why) in NOT_YET.items():
        if key in lifted:
            continue
        v = body.get(key)
        if not any(v is u or (type(v) is type(u) and v == u) for u in unset):
            raise BadRequest(why)


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


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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
    top = min(limits.vocab_size or MAX_TOP_K, MAX_TOP_K)
    if k is not None and (not _is_int(k) or (k < 1 and k != -1) or k > top):
        raise BadRequest(f"top_k must be -1 (all) or an integer in [1, {top}], got {k!r}")
    n = sp.get("n")
    if n is not None and n != 1:
        raise BadRequest("n > 1 is not supported")
    beam = sp.get("beam_width")
    if beam is not None and beam != 1:
        raise BadRequest("beam_width > 1 (beam search) is not supported")
    for key, why in UNSUPPORTED.items():
        if sp.get(key) is not None:
            raise BadRequest(why)
    interval = sp.get("stream_interval")
    if interval is not None and (not _is_int(interval) or not 1 <= interval <= MAX_STREAM_INTERVAL):
        raise BadRequest(f"stream_interval must be an integer in [1, {MAX_STREAM_INTERVAL}], got {interval!r}")
    grammars = [g for g in _GRAMMARS if sp.get(g) is not None]
    for g in grammars:
        if not isinstance(sp[g], str) or len(sp[g]) > MAX_GRAMMAR_CHARS:
            raise BadRequest(f"{g} must be a string of at most {MAX_GRAMMAR_CHARS} characters")
    if len(grammars) > 1:
        raise BadRequest(f"only one of {', '.join(_GRAMMARS)} can be set, got {', '.join(grammars)}")
    for key in _BOOLS:
        if sp.get(key) is not None and not isinstance(sp[key], bool):
            raise BadRequest(f"{key} must be true or false, got {sp[key]!r}")
    seed = sp.get("sampling_seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < 2**63):
        raise BadRequest(f"sampling_seed must be a 64-bit integer, got {seed!r}")
    stop = sp.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest("stop must be a string or a list of strings")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise BadRequest(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters each")
        if any(_has_surrogate(s) for s in stops):
            raise BadRequest("stop: a string is not valid Unicode (a lone surrogate)")
    stop_ids = sp.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_TOKEN_IDS:
            raise BadRequest(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
        check_token_ids(stop_ids, limits, "stop_token_ids")
    bias = sp.get("logit_bias")
    if bias is not None:
        sp["logit_bias"] = check_logit_bias(bias, limits)
    custom = sp.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise BadRequest("custom_params must be a JSON object")
    return sp


def check_logit_bias(bias, limits: ModelLimits) -> dict:
    """`logit_bias` with canonical keys: each a token ID written as sglang and OpenAI write one (ASCII
    digits, no sign, space, underscore or leading zero; `int()` also reads "07", "+7", " 7", "0_7" and
    "٧" as 7, so one token could take any number of keys), at most MAX_LOGIT_BIAS_KEYS of them (every
    role writes one scalar per key at each batch build)."""
    if not isinstance(bias, dict) or not all(
            _is_number(v) and math.isfinite(v) and abs(v) <= MAX_LOGIT_BIAS for v in bias.values()):
        raise BadRequest(f"logit_bias must map token ids to finite numbers in [-{MAX_LOGIT_BIAS:g}, "
                         f"{MAX_LOGIT_BIAS:g}]")
    if len(bias) > MAX_LOGIT_BIAS_KEYS:
        raise BadRequest(f"logit_bias: at most {MAX_LOGIT_BIAS_KEYS} token ids, got {len(bias)}")
    if not all(isinstance(t, str) and t.isascii() and t.isdigit() and (t == "0" or t[0] != "0") for t in bias):
        raise BadRequest("logit_bias keys must be token ids written in decimal digits (e.g. \"50256\")")
    check_token_ids([int(t) for t in bias], limits, "logit_bias")
    return dict(bias)


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
