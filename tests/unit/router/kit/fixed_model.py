"""Fake roles that continue a prompt as one fixed model would (output i of an L-token prompt is
token(L + i)), and what the migration tests do with them over the router's HTTP front: post a
/generate, check the client's final reply (no gap, no duplicate), count migrations by cause."""

import asyncio
import json

from aiohttp import web

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.server.metrics import parse_exposition

PROMPT = [5, 6, 7]


def run(coro, guard_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, guard_s))


def reference(n: int, prompt=PROMPT) -> list[int]:
    return [fu.token(len(prompt) + i) for i in range(n)]


def model(fail_at: int | None = None, how: str = "end", handoff_tokens: int = 0, eager: int = 0, times: int = 1):
    """A streaming role (RLD or MD) on the fixed model. RLD hands off after `handoff_tokens` tokens; MD after a
    handoff (its body carries PDD parameters) starts with `eager` tokens. The first `times` calls fail
    after `fail_at` tokens: end (the stream closes), abort (an abort finish), hang, error400 (a client's
    error inside the stream), 503 (an HTTP error before any token)."""
    calls = {"n": 0}

    async def answer(request, body):
        calls["n"] += 1
        failing = fail_at is not None and calls["n"] <= times
        if failing and how == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        sp = body.get("sampling_params") or {}
        n, lp = sp.get("max_new_tokens", 128), bool(body.get("return_logprob"))
        ids = [fu.token(len(body["input_ids"]) + i) for i in range(n)]
        first = eager if sp.get("custom_params") else 1
        resp = await fu.start_stream(request)
        for c in range(first, n + 1):
            if failing and c > fail_at:
                break
            if handoff_tokens and c == handoff_tokens < n:
                end = HandoffFinish(handoff_tokens=c, mode="one-shot").to_finish()
                await resp.write(fu._sse(fu.chunk(ids[:c], end, lp)))
                await resp.write(b"data: [DONE]\n\n")
                return resp
            await resp.write(fu._sse(fu.chunk(ids[:c], {"type": "length", "length": n} if c == n and not failing else None, lp)))
        if not failing:
            await resp.write(b"data: [DONE]\n\n")
        elif how == "abort":
            await resp.write(fu._sse(fu.chunk(ids[:fail_at], {"type": "abort", "message": "gone"}, lp)))
        elif how == "hang":
            await asyncio.Event().wait()
        elif how == "error400":
            await resp.write(fu._sse({"error": {"message": "bad logit_bias", "code": 400}}))
        return resp
    return answer


async def post_generate(cl, body, pipeline="direct", limit=1, idle_s=30.0):
    async with fu.router_client(cl, pipeline=pipeline, idle_s=idle_s, migration_limit=limit) as c:
        r = await c.post("/generate", json=body)
        text = await r.text()
        metrics = await (await c.get("/metrics")).text()
        health = await c.get("/health")
        return r.status, text, metrics, (health.status, await health.json())


def generate_body(n=12, stream=False, **kw):
    return {"input_ids": PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": n}, **kw}


def final_reply(text: str, stream: bool) -> dict:
    if not stream:
        return json.loads(text)
    lines = [json.loads(x[5:]) for x in text.split("\n") if x.startswith("data:") and "[DONE]" not in x]
    assert all("error" not in x for x in lines), lines
    ids = [x["output_ids"] for x in lines]  # cumulative: each a prefix of the next (no gap, no duplicate)
    assert all(b[:len(a)] == a for a, b in zip(ids, ids[1:]))
    return lines[-1]


def migrations_by_cause(metrics: str) -> dict:
    return {(dict(k)["cause"], dict(k)["outcome"]): v
            for k, v in parse_exposition(metrics, "sglang_pdd_router_migrations_total").items()}
