"""OpenAI-compatible request parsing and response shaping (completions, chat completions).

The prompt becomes token IDs here, with the model's own tokenizer and chat template
(transformers' `apply_chat_template`, as sglang's server does), so every role gets identical input
and the router can match it against MD's cache.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from sglang_pdd.router.api.admission import BadRequest, ModelLimits, check_sampling

SAMPLING_KEYS = {  # OpenAI name -> sglang sampling_params name
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
    "stop": "stop", "stop_token_ids": "stop_token_ids", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos", "seed": "sampling_seed",
}


MAX_MODEL_CHARS = 256  # the client's `model`, echoed in every response and chunk


def check_request(req: dict) -> None:
    """The OpenAI body's own keys (not sampling): `model` a string of bounded length, `stream_options`
    an object whose include_usage is true or false."""
    model = req.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise BadRequest(f"model must be a string of at most {MAX_MODEL_CHARS} characters")
    opts = req.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise BadRequest(f"stream_options must be a JSON object, got {type(opts).__name__}")
        if opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
            raise BadRequest("stream_options.include_usage must be true or false")


# keys the router's builtin OpenAI layer does not serve (sglang's, run by the router, does: sglang_server)
BUILTIN_REFUSES = {"tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
                   "response_format": (None, {"type": "text"})}


def check_builtin(req: dict, chat: bool) -> None:
    """What the builtin layer would drop silently is a 400 naming the key (a tool call must never come
    back as plain text): tools and structured output need sglang's OpenAI layer in the router."""
    for key, unset in BUILTIN_REFUSES.items():
        if req.get(key) not in unset:
            if chat:
                raise BadRequest(f"{key} needs sglang's OpenAI layer in the router: install sglang beside it "
                                 "(--openai-frontend)")
            raise BadRequest(f"{key} is not served on /v1/completions: use /v1/chat/completions, or /generate's "
                             "json_schema, regex or ebnf")


def sampling_params(req: dict, default_max_tokens: int, limits: ModelLimits = ModelLimits()) -> dict:
    n = req.get("n", 1)
    if n is not None and n != 1:
        raise BadRequest("n > 1 is not supported")
    sp = {dst: req[src] for src, dst in SAMPLING_KEYS.items() if req.get(src) is not None}
    sp.setdefault("max_new_tokens", default_max_tokens)
    if isinstance(sp.get("stop"), str):
        sp["stop"] = [sp["stop"]]
    mx = sp["max_new_tokens"]
    if not isinstance(mx, int) or isinstance(mx, bool) or mx < 1:
        raise BadRequest("max_tokens must be a positive integer")
    return check_sampling(sp, limits, name="the request")


def prompt_ids(tokenizer, req: dict, chat: bool) -> list[int]:
    if chat:
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages must be a non-empty list")
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding (a UserDict) in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt is empty")
        return tokenizer.encode(prompt, add_special_tokens=False)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)")


def finish_reason(reason: dict | None) -> str | None:
    if reason is None:
        return None
    return {"length": "length", "stop": "stop"}.get(reason.get("type"), reason.get("type"))


@dataclass
class StopTrim:
    """Text the client sees: hold back what could be the start of a stop string, cut at the stop."""

    stops: list[str] = field(default_factory=list)
    sent: str = ""
    full: str = ""

    def push(self, text: str, final_reason: dict | None) -> str:
        self.full += text
        visible = self.full
        if final_reason is not None:
            matched = final_reason.get("matched") if final_reason.get("type") == "stop" else None
            if isinstance(matched, str) and matched and matched in visible:
                visible = visible[: visible.rindex(matched)]
        elif self.stops:
            visible = visible[: max(len(self.sent), len(visible) - (max(map(len, self.stops)) - 1))]
        out, self.sent = visible[len(self.sent):], visible
        return out


def usage(n_prompt: int, n_completion: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


@dataclass
class ResponseShape:
    chat: bool
    model: str
    id: str = field(default_factory=lambda: "cmpl-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def chunk(self, text: str, reason: str | None, first: bool = False, logprobs=None) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        return {"id": self.id, "object": self.object + ".chunk" if self.chat else self.object,
                "created": self.created, "model": self.model, "choices": [choice]}

    def whole(self, text: str, reason: str | None, use: dict, logprobs=None) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": use}
