"""The router's budget of body bytes across every request in flight (issue 47): a body that does not fit
what is left is a 503 with Retry-After as its bytes arrive, the bytes come back when the request ends
(however it ends), and a request that fits is served beside the refused one."""

import asyncio
import json

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits

LIMITS = ModelLimits(vocab_size=1024, context_len=4096)
BUDGET = 3000


def body(n_ids: int) -> bytes:
    return json.dumps({"input_ids": [5] * n_ids, "sampling_params": {"max_new_tokens": 2}}).encode()


def held(text: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("sglang_pdd_router_body_bytes "))


async def _scenario():
    big = body(600)  # 1,8xx bytes: one fits the budget, two do not
    release = asyncio.Event()

    async def slow():  # the first request's body: most of it now, the rest when the test says
        yield big[:1500]
        await release.wait()
        yield big[1500:]

    async with fu.FakeCluster() as cl:
        async with fu.router_client(cl, limits=LIMITS, max_body_bytes=2500, max_body_bytes_in_flight=BUDGET) as c:
            first = asyncio.ensure_future(c.post("/generate", data=slow()))
            while held(await (await c.get("/metrics")).text()) < 1500:  # the router took its first bytes
                await asyncio.sleep(0.01)
            refused = await c.post("/generate", data=big)
            small = await c.post("/generate", data=body(3))  # fits beside the held bytes
            release.set()
            r1 = await first
            after = held(await (await c.get("/metrics")).text())
            again = await c.post("/generate", data=big)
            metrics = await (await c.get("/metrics")).text()
            return ((refused.status, refused.headers.get("Retry-After"), await refused.text()),
                    small.status, r1.status, after, again.status, held(metrics), metrics)


def test_a_body_over_what_is_left_is_a_503_and_the_bytes_come_back():
    refused, small, first, after, again, at_end, metrics = asyncio.run(asyncio.wait_for(_scenario(), 30))
    status, retry_after, text = refused
    assert status == 503 and retry_after == "1" and "--max-body-mb-in-flight" in text, refused
    assert small == 200 and first == 200
    assert after == 0 and at_end == 0  # every byte given back when its request ended
    assert again == 200  # the same body, once the budget has room
    assert 'sglang_pdd_router_refused_total{reason="body-budget"} 1.0' in metrics
    assert f'sglang_pdd_router_limit{{limit="body-bytes"}} {float(BUDGET)}' in metrics


def test_a_refused_or_failed_request_gives_its_bytes_back():
    """A body refused with 400 after it was read, and one over the per-body limit (413), leave nothing held."""
    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl, limits=LIMITS, max_body_bytes=2500, max_body_bytes_in_flight=BUDGET) as c:
                bad = await c.post("/generate", data=b'{"input_ids": "x"' + b" " * 1500 + b"}")
                huge = await c.post("/generate", data=b"[" + b" " * 2600 + b"]")
                return bad.status, huge.status, held(await (await c.get("/metrics")).text())

    assert asyncio.run(asyncio.wait_for(go(), 30)) == (400, 413, 0)
