"""The router's TTFT histogram: one observation per request that produced a token, labelled with the
pipeline the dispatcher chose; none for a request that failed before its first token."""

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.request.dispatch import RequestFailed
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.router.request.stitch import Delta


class FakeDispatcher:
    """Answers every request on the pipeline named by the prompt's first character."""

    relay = PeerPool("relay", [Peer("http://rld:1")])
    policy = None
    kv_subscribers = ()  # no MD publishes KV events here
    pool_signal = None  # no relay pool scale signal (no --ttft-slo-secs)
    prefill = main = PeerPool("main", [])

    async def start(self):
        pass

    async def close(self):
        pass

    async def generate(self, ids, sp, extra, outcome, pipeline=None):
        outcome.pipeline = {"d": Pipeline.P_MD, "r": Pipeline.P_RLD_MD, "o": Pipeline.P_RLD}.get(chr(ids[0]))
        if chr(ids[0]) == "x":  # fails before any token
            raise RequestFailed("boom")
        yield Delta([], "")  # a delta without tokens does not stop the clock
        yield Delta([104], "h")
        yield Delta([105], "i", {"type": "length"})


async def _exercise() -> str:
    app = RouterApp(FakeDispatcher(), fu.CharTokenizer(), "m")
    async with TestClient(TestServer(app.app)) as client:
        for text, stream in (("d1", False), ("r1", True), ("r2", False), ("o1", False), ("x1", False)):
            r = await client.post("/generate", json={"text": text, "stream": stream})
            await r.read()
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "r3"}],
                                                             "stream": True})
        await r.read()
        r = await client.post("/v1/completions", json={"prompt": "d2"})
        await r.read()
        return await (await client.get("/metrics")).text()


def test_ttft_is_observed_once_per_request_by_pipeline():
    text = asyncio.run(_exercise())
    counts = {dict(k)["pipeline"]: v for k, v in parse_exposition(text, "sglang_pdd_router_ttft_seconds_count").items()}
    assert counts == {"P->MD": 2, "P->RLD->MD": 3, "P->RLD": 1}
    buckets = parse_exposition(text, "sglang_pdd_router_ttft_seconds_bucket")
    inf = {dict(k)["pipeline"]: v for k, v in buckets.items() if dict(k)["le"] == "+Inf"}
    assert inf == counts
    # the failed request is counted as an error, never as a first token
    reqs = parse_exposition(text, "sglang_pdd_router_requests_total")
    assert reqs[(("outcome", "error"), ("pipeline", "none"))] == 1
