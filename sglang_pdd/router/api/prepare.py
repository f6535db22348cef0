"""A client's body, turned into what the dispatcher sends (prompt token IDs, checked sampling
parameters) off the router's event loop.

Bodies may be up to the router's limit (64 MiB by default): parsing and tokenizing one of those
takes seconds, which on the loop would stall every stream the router serves. Both run here in a
few worker threads, each with its own copy of the tokenizer (a fast tokenizer is not safe to share
between threads), so that one huge prompt does not hold up everyone else's. A text whose length
alone proves it longer than the model's context is refused before it is tokenized.

The work waiting for those threads is bounded (`max_queue`, --tokenizer-queue): past it a request is
refused at once (`Busy`: the router answers 503 with Retry-After) instead of queueing without end. A
job whose client went away before a thread took it is dropped from the queue.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sglang_pdd.router.api.openai import shapes as oa
from sglang_pdd.router.api.openai import sglang_server as openai_sglang
from sglang_pdd.router.api.admission import BadRequest, ModelLimits, check_not_yet, check_prompt, check_sampling


def _refuse_constant(name: str):
    """NaN and Infinity are not JSON (Python's parser takes them): a client's NaN must not reach a role."""
    raise BadRequest(f"the body is not valid JSON: {name} is not a number JSON allows")


class Busy(RuntimeError):
    """Every tokenizer thread is busy and the queue is full: the router answers 503 with Retry-After."""


@dataclass
class Prepared:
    body: dict  # the client's body as parsed (for the router's own keys: stream, pdd_pipeline, ...)
    ids: list[int]
    sampling_params: dict
    chat: tuple | None = None  # sglang's (GenerateReqInput, ChatCompletionRequest): `router.api.openai.sglang_server`


def longest_token_chars(tokenizer) -> int | None:
    """The most characters one token's text can have (a bound for "this text has at least N tokens")."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary listing: no bound
        return None
    return max((len(t) for t in vocab), default=0) or None


class Preparer:
    def __init__(self, tokenizer, limits: ModelLimits, default_max_tokens: int, workers: int = 4,
                 max_queue: int = 64, openai=None):
        self._tok, self.limits, self.default_max_tokens = tokenizer, limits, default_max_tokens
        self.openai = openai  # sglang's OpenAI chat layer (`openai_sglang.SglangOpenAI`), or None
        self.capacity = workers + max_queue  # jobs running or waiting, at most
        self._pending, self._pending_lock = 0, threading.Lock()
        self._local = threading.local()
        longest = longest_token_chars(tokenizer) if limits.context_len else None
        # margin 4: normalizers may drop characters, so a token can stand for more than its text
        self.max_text_chars = limits.context_len * longest * 4 if longest else None
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pdd-router-tokenize")

    @property
    def tok(self):
        """This worker thread's own copy of the tokenizer."""
        tok = getattr(self._local, "tok", None)
        if tok is None:
            tok = self._local.tok = copy.deepcopy(self._tok)
        return tok

    async def run(self, kind: str, raw: bytes) -> Prepared:
        """kind: generate (sglang-native), completions or chat (OpenAI). Raises BadRequest, or Busy
        when the queue is full."""
        with self._pending_lock:
            if self._pending >= self.capacity:
                raise Busy(f"the router's tokenizer queue is full ({self.capacity} requests being parsed "
                           "or waiting; --tokenizer-queue); retry later")
            self._pending += 1
        try:
            job = self._pool.submit(self.prepare, kind, raw)
        except RuntimeError:  # shut down
            self._job_done(None)
            raise
        job.add_done_callback(self._job_done)  # also when cancelled before it ran (its waiter went away)
        return await asyncio.wrap_future(job)

    def _job_done(self, _job) -> None:
        with self._pending_lock:
            self._pending -= 1

    @property
    def pending(self) -> int:
        """Jobs running or waiting for a thread."""
        return self._pending

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- in the worker thread ----------------------------------------------------------------
    def prepare(self, kind: str, raw: bytes) -> Prepared:
        try:
            body = json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BadRequest(str(e) if isinstance(e, BadRequest) else "the body is not valid JSON"
                             + (" (nested too deeply)" if isinstance(e, RecursionError) else "")) from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        sglang_chat = kind == "chat" and self.openai is not None
        check_not_yet(body, lifted=openai_sglang.LIFTED if sglang_chat else ())
        if kind == "generate":
            sp = body.get("sampling_params")
            sp = dict(check_sampling({} if sp is None else sp, self.limits))
            if sp.get("max_new_tokens") is None:
                sp["max_new_tokens"] = self.default_max_tokens
            ids = body.get("input_ids")
            if ids is None:
                text = body.get("text")
                if not isinstance(text, str) or not text:
                    raise BadRequest("send non-empty text or input_ids")
                ids = self._encode(text)
            if not isinstance(ids, list) or not ids:
                raise BadRequest("input_ids must be a non-empty list of token ids (one prompt per request)")
        else:
            oa.check_request(body)
            sp = oa.sampling_params(body, self.default_max_tokens, self.limits)
            if sglang_chat:
                return self._sglang_chat(body)
            oa.check_builtin(body, chat=kind == "chat")
            ids = self._openai_prompt(body, chat=kind == "chat")
        check_prompt(ids, sp["max_new_tokens"], self.limits)
        return Prepared(body, ids, sp)

    def _sglang_chat(self, body: dict) -> Prepared:
        """A chat request converted by sglang's own OpenAI layer (template, tools, constraints), its
        sampling parameters then checked as any request's."""
        self._check_messages(body)
        chat = getattr(self._local, "chat", None)
        if chat is None:
            chat = self._local.chat = self.openai.chat_for_thread()
        adapted, request = openai_sglang.convert(chat, body)
        sp = {k: v for k, v in adapted.sampling_params.items() if v is not None}
        if sp.get("max_new_tokens") is None:
            sp["max_new_tokens"] = self.default_max_tokens
        check_sampling(sp, self.limits, name="the request")
        ids = list(adapted.input_ids)
        check_prompt(ids, sp["max_new_tokens"], self.limits)
        return Prepared(body, ids, sp, chat=(adapted, request))

    def _check_messages(self, body: dict) -> None:
        """The chat messages' text contents, bounded before any template renders them."""
        msgs = body.get("messages")
        if isinstance(msgs, list):
            self._check_text("".join(m["content"] for m in msgs if isinstance(m, dict) and isinstance(
                m.get("content"), str)))

    def _check_text(self, text: str) -> None:
        if self.max_text_chars is not None and len(text) > self.max_text_chars:
            raise BadRequest(f"the prompt ({len(text)} characters) is longer than the model's context length "
                             f"({self.limits.context_len} tokens)")

    def _encode(self, text: str) -> list[int]:
        self._check_text(text)
        return self.tok.encode(text, add_special_tokens=False)

    def _openai_prompt(self, body: dict, chat: bool) -> list[int]:
        if chat:
            self._check_messages(body)
        elif isinstance(body.get("prompt"), str):
            self._check_text(body["prompt"])
        try:
            return oa.prompt_ids(self.tok, body, chat)
        except BadRequest:
            raise
        except Exception as e:  # a chat template that cannot render these messages
            raise BadRequest(f"cannot build the prompt: {e}") from None
