"""A client's body, turned into what the dispatcher sends (prompt token IDs, checked sampling
parameters) off the router's event loop.

Bodies may be up to the router's limit (64 MiB by default): parsing and tokenizing one of those
takes seconds, which on the loop would stall every stream the router serves. Both run here in a
few worker threads, each with its own copy of the tokenizer (a fast tokenizer is not safe to share
between threads), so that one huge prompt does not hold up everyone else's. A text whose length
alone proves it longer than the model's context is refused before it is tokenized.

The work waiting for those threads is bounded (`max_queue`, --tokenizer-queue): past it a request is
refused at once (`Busy`: the router answers 503 with Retry-After) instead of queueing without end. A
job whose client went away before a thread took it is dropped from the queue; one a thread runs stops
at its next stage (after parsing, before the template, before tokenizing: `Abandoned`).
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


class Abandoned(Exception):
    """The job's client went away: the worker stops before its next stage (nobody reads the result)."""


class Busy(RuntimeError):
    """Every tokenizer thread is busy and the queue is full: the router answers 503 with Retry-After."""


@dataclass
class Prepared:
    body: dict  # the client's body as parsed (for the router's own keys: stream, pdd_pipeline, ...)
    ids: list[int]
    sampling_params: dict
    chat: tuple | None = None  # sglang's (GenerateReqInput, ChatCompletionRequest): `router.api.openai.sglang_server`


# The body's fields a chat template renders into the prompt: their text counts against the context.
PROMPT_FIELDS = ("messages", "tools", "chat_template_kwargs", "prompt")
MAX_TOOLS = 128  # tools per request (OpenAI's bound): each is rendered, and compiled into a structural tag


def text_chars(value) -> int:
    """The characters of every string in a parsed JSON value (keys included), at any depth: iterative,
    so a deeply nested value costs no recursion."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, dict):
            n += sum(len(k) for k in v if isinstance(k, str))
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


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
        left = threading.Event()
        try:
            job = self._pool.submit(self._run_job, kind, raw, left)
        except RuntimeError:  # shut down
            self._job_done(None)
            raise
        job.add_done_callback(self._job_done)  # also when cancelled before it ran (its waiter went away)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            left.set()  # a job a thread already runs stops at its next stage
            raise

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
    def _run_job(self, kind: str, raw: bytes, left: threading.Event) -> Prepared:
        self._local.left = left
        try:
            return self.prepare(kind, raw)
        finally:
            self._local.left = None

    def _stage(self) -> None:
        """Between two stages of a job: stop if its client went away."""
        left = getattr(self._local, "left", None)
        if left is not None and left.is_set():
            raise Abandoned

    def prepare(self, kind: str, raw: bytes) -> Prepared:
        try:
            body = json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BadRequest(str(e) if isinstance(e, BadRequest) else "the body is not valid JSON"
                             + (" (nested too deeply)" if isinstance(e, RecursionError) else "")) from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        self._stage()
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
        self._stage()
        chat = getattr(self._local, "chat", None)
        if chat is None:
            chat = self._local.chat = self.openai.chat_for_thread()
        adapted, request = openai_sglang.convert(chat, body)
        self._stage()
        sp = {k: v for k, v in adapted.sampling_params.items() if v is not None}
        if sp.get("max_new_tokens") is None:
            sp["max_new_tokens"] = self.default_max_tokens
        check_sampling(sp, self.limits, name="the request")
        ids = list(adapted.input_ids)
        check_prompt(ids, sp["max_new_tokens"], self.limits)
        return Prepared(body, ids, sp, chat=(adapted, request))

    def _check_messages(self, body: dict) -> None:
        """Every text a chat template may render, bounded before it renders any: the messages (string
        contents, list-form content parts, names, tool calls), `tools`, `chat_template_kwargs`; and
        the lists it walks: a message renders at least one token, so no more messages than the
        context holds; at most MAX_TOOLS tools (OpenAI's bound)."""
        msgs, tools = body.get("messages"), body.get("tools")
        ctx = self.limits.context_len
        if isinstance(msgs, list) and ctx is not None and len(msgs) > ctx:
            raise BadRequest(f"messages: {len(msgs)} messages are more than the model's context length "
                             f"({ctx} tokens) can hold")
        if isinstance(tools, list) and len(tools) > MAX_TOOLS:
            raise BadRequest(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}")
        self._check_chars(sum(text_chars(body.get(k)) for k in PROMPT_FIELDS))

    def _check_text(self, text: str) -> None:
        self._check_chars(len(text))

    def _check_chars(self, n: int) -> None:
        if self.max_text_chars is not None and n > self.max_text_chars:
            raise BadRequest(f"the prompt ({n} characters) is longer than the model's context length "
                             f"({self.limits.context_len} tokens)")

    def _encode(self, text: str) -> list[int]:
        self._check_text(text)
        self._stage()
        return self.tok.encode(text, add_special_tokens=False)

    def _openai_prompt(self, body: dict, chat: bool) -> list[int]:
        if chat:
            self._check_messages(body)
        else:
            self._check_chars(text_chars(body.get("prompt")))
        self._stage()
        try:
            return oa.prompt_ids(self.tok, body, chat)
        except BadRequest:
            raise
        except Exception as e:  # a chat template that cannot render these messages
            raise BadRequest(f"cannot build the prompt: {e}") from None
