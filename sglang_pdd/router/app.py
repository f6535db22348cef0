"""The PDD router's HTTP front: sglang-native /generate, OpenAI /v1/completions and
/v1/chat/completions (streaming SSE and not), /v1/models, /metrics, and three probes: /live (the process
serves), /ready (some pipeline can serve a request: `router.peers.readiness`), /health (every role in service).

Clients come in through the front door (`router.api.front_door`: read deadlines, the connection cap;
`router.api.client_auth`: API keys; `router.api.in_flight`: request caps); serve with `RouterApp.serve`."""

from __future__ import annotations

import logging
import time

import msgspec
from aiohttp import web

from sglang_pdd.protocol.reply import KEY as REPLY_KEY, MainChoiceMeta, ReplyMeta
from sglang_pdd.router.api.openai import shapes as oa
from sglang_pdd.router.api.admission import BadRequest, ModelLimits
from sglang_pdd.router.api import front_door
from sglang_pdd.router.api.openai import chat as openai_chat
from sglang_pdd.router.api.body_budget import BodyBudget
from sglang_pdd.router.api.client_auth import ClientAuth
from sglang_pdd.router.api.grammar.guard import GrammarBounds, GrammarBusy, GrammarGuard
from sglang_pdd.router.request.dispatch import PIPELINE_MODES, Dispatcher, Outcome, RequestFailed
from sglang_pdd.router.api.front_door import FrontDoor, FrontDoorConfig
from sglang_pdd.router.api.in_flight import InFlight
from sglang_pdd.router.api.prepare import Busy, Prepared, Preparer
from sglang_pdd.router.peers.readiness import readiness
from sglang_pdd.router.request.first_token import FirstToken
from sglang_pdd.router.metrics import RouterMetrics  # noqa: F401 (RouterMetrics: imported from here)
from sglang_pdd.router.request.stitch import Delta

logger = logging.getLogger(__name__)


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else msgspec.json.encode(obj)) + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class RouterApp:
    def __init__(self, dispatcher: Dispatcher, tokenizer, model_name: str, default_max_tokens: int = 128,
                 limits: ModelLimits = ModelLimits(), max_body_bytes: int = 64 << 20,
                 door: FrontDoorConfig = FrontDoorConfig(), api_keys: tuple[str, ...] = (),
                 tokenizer_workers: int = 4, tokenizer_queue: int = 64, openai=None,
                 max_body_bytes_in_flight: int = 256 << 20, grammar: GrammarBounds = GrammarBounds()):
        """`openai`: sglang's OpenAI chat layer (`openai.sglang_server.SglangOpenAI`) for /v1/chat/completions;
        None: the router's own minimal one (text only). `grammar`: the bounds of a request's grammar compile
        (`router.api.grammar.guard`; its workers start at the first grammar unless `self.grammar.start()`)."""
        self.d, self.tok, self.model = dispatcher, tokenizer, model_name
        self.openai = openai
        self.default_max_tokens, self.limits = default_max_tokens, limits
        self.metrics = RouterMetrics()
        self.prep = Preparer(tokenizer, limits, default_max_tokens, tokenizer_workers, tokenizer_queue, openai)
        self.grammar = GrammarGuard(tokenizer, limits.vocab_size, grammar)
        self.door = FrontDoor(door, self.metrics)
        self.in_flight = InFlight(door.max_in_flight, door.max_in_flight_per_client, door.retry_after_s, self.metrics)
        self.bodies = BodyBudget(max_body_bytes_in_flight, door.retry_after_s, self.metrics)
        for name, v in (("connections", door.max_connections), ("in-flight", door.max_in_flight),
                        ("per-client", door.max_in_flight_per_client), ("tokenizer-queue", self.prep.capacity),
                        ("body-bytes", max_body_bytes_in_flight), ("grammar-queue", self.grammar.capacity)):
            self.metrics.limit.labels(name).set(v)
        auth = ClientAuth(api_keys, self.metrics)
        app = web.Application(client_max_size=max_body_bytes, middlewares=[auth.middleware, self.in_flight.middleware,
                                                                               self.bodies.middleware])
        app.add_routes([
            web.post("/generate", self.generate), web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat), web.get("/v1/models", self.models),
            web.get("/health", self.health), web.get("/metrics", self.metrics_page),
            web.get("/live", self.live), web.get("/ready", self.ready),
        ])
        app.on_startup.append(lambda _: self.d.start())
        app.on_cleanup.append(lambda _: self.d.close())
        app.on_cleanup.append(self._close_prep)
        self.app = app

    async def _close_prep(self, _app) -> None:
        self.prep.close()
        self.grammar.close()

    def serve(self, host: str, port: int) -> None:
        """Serve through the front door until SIGINT/SIGTERM."""
        front_door.serve(self.app, self.door, host, port)

    async def live(self, _req):
        """Liveness: 200 while the event loop serves; no peer is asked (a WAN cut must not restart us)."""
        return web.json_response({"status": "live"})

    async def ready(self, _req):
        """Readiness: 200 while some pipeline can serve a request (RLD alone counts), else 503 saying
        what is missing (`router.peers.readiness`)."""
        r = readiness(self.d.prefill, self.d.relay, self.d.main, self.d.cfg.migration_limit, self.d.cfg.pipeline)
        return web.json_response(r.body(), status=200 if r.ready else 503)

    async def health(self, _req):
        """200 while every configured role has a peer in service, else 503; the body lists the peers out.
        Stricter than /ready (a dashboard's "all well"; test harnesses wait on it for every role)."""
        pools = [pool for pool in (self.d.prefill, self.d.relay, self.d.main) if pool]
        out = {pool.role: [p.url for p in pool.out()] for pool in pools}
        down = [pool.role for pool in pools if len(out[pool.role]) == len(pool.peers)]
        body = {"status": "degraded" if down else "ok", "out": {r: u for r, u in out.items() if u}, "down": down}
        return web.json_response(body, status=503 if down else 200)

    async def models(self, _req):
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def metrics_page(self, _req):
        from prometheus_client import generate_latest

        if self.d.policy is not None:
            self.metrics.bandwidth.set(self.d.policy.bandwidth.bytes_per_s)
        if self.d.pool_signal is not None:
            now, up = time.monotonic(), self.d.placement.relay_pool().up
            requests, at_risk = self.d.pool_signal.counts(now)
            self.metrics.pool_at_risk.set(at_risk / requests if requests else 0.0)
            self.metrics.pool_target.set(self.d.pool_signal.target(now, up, self.d.placement.relay_occupancy()))
        for pool in (self.d.prefill, self.d.relay, self.d.main):
            for peer in pool.peers:
                self.metrics.peer_load.labels(pool.role, peer.url).set(peer.load)
                self.metrics.peer_in_flight.labels(pool.role, peer.url).set(peer.in_flight)
                self.metrics.peer_busy.labels(pool.role, peer.url).set(peer.busy.fraction)
                out = peer.health.out_until is not None or bool(peer.health.refused)
                self.metrics.peer_out.labels(pool.role, peer.url).set(1 if out else 0)
        for sub in self.d.kv_subscribers:
            seq = sub.feed.last_seq
            self.metrics.md_view_seq.labels(sub.view.name).set(-1 if seq is None else seq)
            self.metrics.md_view_exact.labels(sub.view.name).set(1 if sub.view.exact else 0)
        self.metrics.open_connections.set(self.door.open)
        self.metrics.in_flight.set(self.in_flight.total)
        self.metrics.tokenizer_queue.set(self.prep.pending)
        self.metrics.body_bytes.set(self.bodies.held)
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    async def _prepared(self, request, kind: str) -> Prepared | web.Response:
        """The client's body parsed, checked and tokenized off the event loop, its grammar compiled within
        bounds; an error response for a client error (413 for a body over the limit, 408 for one too
        slow, else 400); 503 with Retry-After when the tokenizer queue or the grammar compiles are full."""
        raw = await front_door.read_body(request, self.door, self.bodies)
        if isinstance(raw, web.Response):
            return raw
        try:
            prep = await self.prep.run(kind, raw)
            await self.grammar.check(prep.sampling_params, prep.body)
            return prep
        except BadRequest as e:
            return _error(400, str(e))
        except (Busy, GrammarBusy) as e:
            reason = e.reason if isinstance(e, GrammarBusy) else "tokenizer-queue"
            if reason is not None:
                self.metrics.refused.labels(reason).inc()
            return web.json_response({"error": {"message": str(e), "code": 503}}, status=503,
                                     headers={"Retry-After": str(self.door.cfg.retry_after_s)})
        except Exception:  # the router's own bug, not the client's: say so, keep serving
            logger.exception("preparing a %s request failed", kind)
            return _error(500, "the router failed to prepare this request")

    async def _first(self, stream, clock: "FirstToken") -> tuple[Delta | None, web.Response | None]:
        """The stream's first delta, or the error response a failure before it becomes: nothing was
        sent yet, so the client still gets the failure's own status."""
        try:
            d = await stream.__anext__()
        except StopAsyncIteration:
            return None, None
        except RequestFailed as e:
            return None, _error(e.status, str(e))
        finally:  # the dispatcher chose the MD before anything came back
            self.metrics.chose(clock.outcome)
        clock.tick(d)
        return d, None

    # -- sglang-native ----------------------------------------------------------------------
    async def generate(self, request):
        t0 = time.perf_counter()
        prep = await self._prepared(request, "generate")
        if isinstance(prep, web.Response):
            return prep
        body, ids, sp = prep.body, prep.ids, prep.sampling_params
        pipeline = body.get("pdd_pipeline")
        if pipeline is not None and pipeline not in PIPELINE_MODES:
            return _error(400, f"pdd_pipeline must be one of {', '.join(PIPELINE_MODES)}")
        if pipeline is not None and pipeline != "direct" and not self.d.relay:
            return _error(400, f"pdd_pipeline {pipeline} needs a relay; this router has none")
        extra = {"return_logprob": True} if body.get("return_logprob") else {}
        outcome = Outcome()
        stream = self.d.generate(ids, sp, extra, outcome, pipeline=pipeline)
        try:
            return await self._native(request, body, ids, stream, outcome, FirstToken(self.metrics, outcome, t0))
        finally:  # also when the client went away mid-write: the dispatcher aborts every role's copy now
            await stream.aclose()

    async def _native(self, request, body, ids, stream, outcome: Outcome, clock: FirstToken):
        out_ids, text, reason = [], "", None
        first, failed = await self._first(stream, clock)
        if failed is not None:
            self.metrics.record(outcome, False, 0)
            return failed
        if body.get("stream"):
            return await self._stream_native(request, first, stream, outcome, len(ids), clock)
        try:
            async for delta in _chain(first, stream):
                clock.tick(delta)
                out_ids += delta.token_ids
                text += delta.text
                reason = delta.finish_reason or reason
        except RequestFailed as e:
            self.metrics.record(outcome, False, len(out_ids))
            return _error(e.status, str(e))
        self.metrics.record(outcome, True, len(out_ids))
        return web.json_response({"text": text, "output_ids": out_ids,
                                  "meta_info": self._meta(outcome, reason, len(ids), len(out_ids))})

    def _meta(self, outcome: Outcome, reason, n_prompt: int, n_out: int) -> dict:
        pdd = ReplyMeta(pipeline=outcome.pipeline.value if outcome.pipeline else None,
                        handoff_tokens=outcome.handoff_tokens, handoff_mode=outcome.handoff_mode,
                        reason=outcome.reason, md_hit=outcome.md_hit, missed_bytes=outcome.missed_bytes,
                        predicted_wan_s=outcome.predicted_wan_s, rld_in_flight=outcome.rld_in_flight,
                        md=MainChoiceMeta(**outcome.main_choice.public()) if outcome.main_choice else None,
                        migrations=len(outcome.migrations), migration_causes=list(outcome.migrations),
                        migration_pipelines=list(outcome.migration_pipelines))
        meta = {"finish_reason": reason, "prompt_tokens": n_prompt, "completion_tokens": n_out,
                REPLY_KEY: pdd.to_builtins()}
        if outcome.output_logprobs is not None:
            meta["output_token_logprobs"] = outcome.output_logprobs
        return meta

    async def _stream_native(self, request, first, stream, outcome, n_prompt: int, clock: FirstToken):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        out_ids, text = [], ""
        try:
            async for delta in _chain(first, stream):
                clock.tick(delta)
                out_ids += delta.token_ids
                text += delta.text
                await resp.write(_sse({"text": text, "output_ids": out_ids,
                                       "meta_info": self._meta(outcome, delta.finish_reason, n_prompt, len(out_ids))}))
            self.metrics.record(outcome, True, len(out_ids))
        except RequestFailed as e:
            self.metrics.record(outcome, False, len(out_ids))
            await resp.write(_sse({"error": {"message": str(e), "code": e.status}}))
        await resp.write(_sse(b"[DONE]"))
        return resp

    # -- OpenAI ------------------------------------------------------------------------------
    async def completions(self, request):
        return await self._openai(request, chat=False)

    async def chat(self, request):
        return await self._openai(request, chat=True)

    async def _openai(self, request, chat: bool):
        t0 = time.perf_counter()
        prep = await self._prepared(request, "chat" if chat else "completions")
        if isinstance(prep, web.Response):
            return prep
        body, ids, sp = prep.body, prep.ids, prep.sampling_params
        outcome = Outcome()
        stream = self.d.generate(ids, sp, openai_chat.role_extra(prep.chat[0]) if prep.chat else {}, outcome)
        clock = FirstToken(self.metrics, outcome, t0)
        try:
            if prep.chat is not None:
                return await self._sglang_chat(request, prep, stream, outcome, clock)
            shape = oa.ResponseShape(chat=chat, model=body.get("model") or self.model)
            trim = oa.StopTrim(stops=list(sp.get("stop") or []))
            return await self._openai_run(request, body, ids, sp, stream, outcome, clock, shape, trim)
        finally:  # as in generate
            await stream.aclose()

    async def _sglang_chat(self, request, prep: Prepared, stream, outcome: Outcome, clock: FirstToken):
        first, failed = await self._first(stream, clock)
        if failed is not None:
            self.metrics.record(outcome, False, 0)
            return failed
        return await openai_chat.serve(request, prep, stream, outcome, clock, first, self.metrics, self.openai.chat)

    async def _openai_run(self, request, body, ids, sp, stream, outcome: Outcome, clock: FirstToken, shape, trim):
        n_out = 0
        first_delta, failed = await self._first(stream, clock)
        if failed is not None:
            self.metrics.record(outcome, False, 0)
            return failed
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            first = True
            try:
                async for delta in _chain(first_delta, stream):
                    clock.tick(delta)
                    n_out += len(delta.token_ids)
                    text = trim.push(delta.text, delta.finish_reason)
                    reason = oa.finish_reason(delta.finish_reason)
                    if text or reason or first:
                        await resp.write(_sse(shape.chunk(text, reason, first=first)))
                        first = False
                if (body.get("stream_options") or {}).get("include_usage"):
                    await resp.write(_sse({**shape.chunk("", None), "choices": [], "usage": oa.usage(len(ids), n_out)}))
                self.metrics.record(outcome, True, n_out)
            except RequestFailed as e:
                self.metrics.record(outcome, False, n_out)
                await resp.write(_sse({"error": {"message": str(e), "code": e.status}}))
            await resp.write(_sse(b"[DONE]"))
            return resp
        reason = None
        try:
            async for delta in _chain(first_delta, stream):
                clock.tick(delta)
                n_out += len(delta.token_ids)
                trim.push(delta.text, delta.finish_reason)
                reason = delta.finish_reason or reason
        except RequestFailed as e:
            self.metrics.record(outcome, False, n_out)
            return _error(e.status, str(e))
        self.metrics.record(outcome, True, n_out)
        return web.json_response(shape.whole(trim.sent, oa.finish_reason(reason), oa.usage(len(ids), n_out)))


async def _chain(first: Delta | None, rest):
    if first is not None:
        yield first
    async for d in rest:
        yield d
