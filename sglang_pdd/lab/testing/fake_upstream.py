"""Fake sglang servers for the PDD router (no sglang, no model): the router's unit tests and its
benchmark (`micro.router_bench`) put them behind a real `Dispatcher` and `RouterApp`.

Each `FakeRole` answers `/generate` as its role does in sglang, the wire format included: P answers
one JSON reply; RLD and MD stream SSE lines of cumulative `output_ids` (and logprobs when asked;
deltas with `incremental`, as sglang's `--incremental-streaming-output`; `completion_tokens` either way),
RLD ending with the `pdd_handoff` finish after `handoff_tokens` tokens, MD starting over at t1. Output
token i of any request is `token(i)`. `behaviour` replaces the normal answer for one test (a hang, an
error, a broken stream, ...). Every body and every abort is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.api.grammar.guard import GrammarBounds
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
from sglang_pdd.router.peers.pool import Peer, PeerPool


def token(i: int) -> int:
    return 97 + i % 26  # 'a'..'z' for a tokenizer whose token t is chr(t)


class CharTokenizer:
    """Token t is the character chr(t) (what the fakes' token() streams decodes to letters)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True):
        return "".join(map(chr, ids))

    def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
        return [ord(c) for m in msgs for c in m["content"]]

    def get_vocab(self):
        return {chr(i): i for i in range(32, 1024)}


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(ids: list[int], reason: dict | None, logprobs: bool, first: int = 0, **meta) -> dict:
    """A streamed chunk of output tokens `first` on (0: a cumulative chunk)."""
    m = {"finish_reason": reason, **meta}
    if logprobs:
        m["output_token_logprobs"] = [[-0.123456789012345 - i * 1e-9, t, None] for i, t in enumerate(ids, first)]
    return {"text": "", "output_ids": ids, "meta_info": m}


@dataclass
class FakeRole:
    role: str  # prefill, relay, main
    handoff_tokens: int = 4  # relay: tokens before it hands off (0: it never hands off)
    every: int = 1  # tokens per streamed chunk (sglang's stream_interval)
    incremental: bool = False  # stream deltas (sglang's --incremental-streaming-output), not cumulative
    behaviour: Callable[[web.Request, dict], Awaitable[web.StreamResponse]] | None = None
    site: str = ""  # main: the router's site of this MD
    running: float = 0.0  # main: requests running on it as its /metrics would say (other routers' load)
    bodies: list[dict] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    # sglang's --api-key (None: open): without `Authorization: Bearer KEY` every call but /health*, /ready*
    # and /metrics* is a 401, by sglang's own rule. A test may change it while the role runs.
    api_key: str | None = None

    def app(self) -> web.Application:
        if self.api_key is not None:
            self._auth()  # sglang's import takes seconds: not while a request waits (or a router's timeout runs)
        app = web.Application(client_max_size=1 << 30, middlewares=[self._key_check])
        app.add_routes([web.post("/generate", self.generate), web.post("/abort_request", self.abort),
                        web.get("/health", self.health), web.get("/model_info", self.model_info)])
        return app

    @web.middleware
    async def _key_check(self, request, handler):
        if self.api_key is None:
            return await handler(request)
        AuthLevel, decide_request_auth = self._auth()
        level = AuthLevel.ADMIN_OPTIONAL if request.path == "/abort_request" else AuthLevel.NORMAL
        if not decide_request_auth(method=request.method, path=request.path, api_key=self.api_key,
                                   authorization_header=request.headers.get("Authorization"),
                                   admin_api_key=None, auth_level=level).allowed:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    @staticmethod
    def _auth():
        from sglang.srt.utils.auth import AuthLevel, decide_request_auth

        return AuthLevel, decide_request_auth

    async def health(self, _request):
        return web.Response(text="ok")

    async def model_info(self, _request):
        return web.json_response({"model_path": "fake", "is_generation": True})

    async def abort(self, request):
        self.aborts.append((await request.json()).get("rid"))
        return web.json_response({})

    async def generate(self, request):
        body = await request.json()
        self.bodies.append(body)
        if self.behaviour is not None:
            return await self.behaviour(request, body)
        if self.role == "prefill":
            return web.json_response({"text": "", "output_ids": [token(0)],
                                      "meta_info": {"finish_reason": {"type": "length", "length": 1}}})
        n = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
        lp = bool(body.get("return_logprob"))
        ids = [token(i) for i in range(n)]
        if self.role == "relay" and 0 < self.handoff_tokens < n:
            ends = {self.handoff_tokens: HandoffFinish(handoff_tokens=self.handoff_tokens, mode="one-shot").to_finish()}
            n = self.handoff_tokens
        else:
            ends = {n: {"type": "length", "length": n}}
        resp = await start_stream(request)
        cuts = list(range(self.every, n, self.every)) + [n]
        start = self.handoff_tokens if self.role == "main" and body.get("sampling_params", {}).get(
            "custom_params") else 0  # MD after a handoff: its first chunk already holds t1..tk
        sent = 0
        for c in cuts:
            if c < start:
                continue
            first = sent if self.incremental else 0
            await resp.write(_sse(chunk(ids[first:c], ends.get(c), lp, first, completion_tokens=c)))
            sent = c
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def start_stream(request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


# -- behaviours for one test --------------------------------------------------------------------
def status(code: int, message: str):
    async def answer(request, body):
        return web.json_response({"error": {"message": message, "code": code}}, status=code)
    return answer


def stream_then(chunks: list[dict], then: str = "end", error: dict | None = None):
    """Stream `chunks`, then: end (close without [DONE] or finish), hang (never answer again),
    error (an sglang error object inside the 200 stream), garbage (a line that is not JSON)."""
    async def answer(request, body):
        resp = await start_stream(request)
        for c in chunks:
            await resp.write(_sse(c))
        if then == "hang":
            await asyncio.Event().wait()
        elif then == "error":
            await resp.write(_sse({"error": error}))
            await resp.write(b"data: [DONE]\n\n")
        elif then == "garbage":
            await resp.write(b"data: {not json\n\n")
        return resp
    return answer


def hang():
    async def answer(request, body):
        await asyncio.Event().wait()
    return answer


@dataclass
class FakeCluster:
    """One fake P, RLD and MD on aiohttp test servers; `pools()` gives the router's peer pools."""

    prefill: FakeRole = field(default_factory=lambda: FakeRole("prefill"))
    relay: FakeRole = field(default_factory=lambda: FakeRole("relay"))
    main: FakeRole = field(default_factory=lambda: FakeRole("main"))
    main2: FakeRole | None = None  # a second MD (migration, ejection)
    main3: FakeRole | None = None  # a third (sites)
    servers: list = field(default_factory=list)

    async def __aenter__(self) -> "FakeCluster":
        for r in (self.prefill, self.relay, self.main) + self._more_mains():
            s = TestServer(r.app())
            await s.start_server()
            self.servers.append(s)
        self.urls = [str(s.make_url("")).rstrip("/") for s in self.servers]
        return self

    async def __aexit__(self, *exc) -> None:
        for s in self.servers:
            await s.close()

    def _more_mains(self) -> tuple[FakeRole, ...]:
        return tuple(r for r in (self.main2, self.main3) if r is not None)

    def url(self, i: int) -> str:
        return self.urls[i]

    def pools(self) -> tuple[PeerPool, PeerPool, PeerPool]:
        host = self.servers[1].host
        return (PeerPool("prefill", [Peer(self.url(0), bootstrap_port=1)]),
                PeerPool("relay", [Peer(self.url(1), token_channel=f"tcp://{host}:1")]),
                PeerPool("main", [Peer(self.url(2 + i), site=r.site, running=r.running)
                                  for i, r in enumerate((self.main,) + self._more_mains())]))


@contextlib.asynccontextmanager
async def router_client(cluster: FakeCluster, pipeline: str = "direct", idle_s: float = 30.0,
                        limits: ModelLimits = ModelLimits(vocab_size=1024, context_len=1 << 16),
                        tokenizer=None, max_body_bytes: int = 64 << 20, migration_limit: int = 0,
                        signer=None, max_body_bytes_in_flight: int = 256 << 20, openai=None,
                        grammar: GrammarBounds = GrammarBounds()):
    """A test client on a real router (Dispatcher + RouterApp) in front of `cluster`. Migration is off
    unless asked for: most tests pin what a failure does to the client. `openai`: sglang's chat layer
    (`router.api.openai.sglang_server.SglangOpenAI`, over `tokenizer`'s model) for /v1/chat/completions.
    `grammar`: the bounds of a request's grammar compile (`router.api.grammar.guard`)."""
    tok = tokenizer or CharTokenizer()
    cfg = DispatchConfig(pipeline, request_timeout_s=max(60.0, idle_s), bandwidth_poll_s=0, load_poll_s=0,
                         idle_timeout_s={r: idle_s for r in ("prefill", "relay", "main")},
                         migration_limit=migration_limit, health_check_s=0)
    d = Dispatcher(*cluster.pools(), cfg, decode=functools.partial(tok.decode, skip_special_tokens=True), signer=signer,
                   kept_stop_ids=openai.kept_stop_ids if openai is not None else frozenset())
    app = RouterApp(d, tok, "fake", limits=limits, max_body_bytes=max_body_bytes,
                    max_body_bytes_in_flight=max_body_bytes_in_flight, openai=openai, grammar=grammar)
    async with TestClient(TestServer(app.app)) as client:
        yield client
