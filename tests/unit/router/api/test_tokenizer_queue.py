"""The tokenizer threads' queue is bounded (issue 31): past it a request is a 503 with Retry-After at
once, and a queued job whose client went away frees its place."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.api.prepare import Busy, Preparer
from tests.unit.router.kit.front_door import connect, metrics_text, refused, request, response, served, until


class GatedTokenizer(fu.CharTokenizer):
    """encode() waits for `gate` (one shared instance across the router's per-thread copies)."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Semaphore(0)

    def __deepcopy__(self, memo):
        return self

    def encode(self, text, add_special_tokens=False):
        self.entered.release()
        assert self.gate.wait(30), "never released"
        return super().encode(text)


def gen(text: str) -> bytes:
    return request("POST", "/generate", json.dumps({"text": text, "sampling_params": {"max_new_tokens": 2}}).encode())


def test_a_full_tokenizer_queue_is_a_503_with_retry_after():
    tok = GatedTokenizer()

    async def go():
        kw = {"tokenizer_workers": 1, "tokenizer_queue": 1}
        async with served(tokenizer=tok, app_kw=kw) as (app, port):
            app.d.release.set()
            a = await connect(port, gen("ab"))  # in the one thread
            b = await connect(port, gen("cd"))  # waiting for it
            await until(lambda: app.prep.pending == 2, "one job running, one waiting")
            r, w = await connect(port, gen("ef"))
            full = await response(r)
            tok.gate.set()
            done = [(await response(x[0]))[0] for x in (a, b)]
            counts = refused(await metrics_text(port))
            for x in (a, b, (r, w)):
                x[1].close()
            return full, done, counts, app.prep.pending
    full, done, counts, pending = asyncio.run(go())
    assert full[0] == 503 and full[1]["retry-after"] == "1" and b"--tokenizer-queue" in full[2]
    assert done == [200, 200] and counts["tokenizer-queue"] == 1 and pending == 0


def test_a_waiting_job_whose_client_left_frees_its_place():
    tok = GatedTokenizer()
    prep = Preparer(tok, ModelLimits(), 4, workers=1, max_queue=1)
    body = json.dumps({"text": "ab"}).encode()

    async def go():
        running = asyncio.ensure_future(prep.run("generate", body))
        await asyncio.get_running_loop().run_in_executor(None, tok.entered.acquire)
        waiting = asyncio.ensure_future(prep.run("generate", body))
        await asyncio.sleep(0)
        with pytest.raises(Busy):
            await prep.run("generate", body)
        waiting.cancel()  # its client went away before a thread took it
        await asyncio.gather(waiting, return_exceptions=True)
        freed = prep.pending
        again = asyncio.ensure_future(prep.run("generate", body))  # room again
        tok.gate.set()
        return freed, (await running).ids, (await again).ids

    try:
        freed, a, b = asyncio.run(go())
    finally:
        prep.close()
    assert freed == 1 and a == b == [97, 98]
