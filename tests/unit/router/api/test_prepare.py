"""Bodies are parsed and tokenized off the router's event loop (issue 14 item 4): while one client's
prompt is being tokenized, the router keeps serving everyone else."""

import asyncio
import threading

from sglang_pdd.lab.testing import fake_upstream as fu


class BlockingTokenizer(fu.CharTokenizer):
    """encode() waits until the test lets it go, and records the thread it ran on."""

    def __init__(self):
        self.release, self.entered, self.threads = threading.Event(), threading.Event(), []

    def __deepcopy__(self, memo):  # one shared spy (the router copies its tokenizer per worker)
        return self

    def encode(self, text, add_special_tokens=False):
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.release.wait(20), "never released"
        return super().encode(text)


def test_a_slow_tokenization_does_not_stall_the_router():
    tok = BlockingTokenizer()

    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl, tokenizer=tok) as c:
                slow = asyncio.create_task(c.post("/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 2}}))
                await asyncio.get_running_loop().run_in_executor(None, tok.entered.wait, 20)
                health = await c.get("/health")  # answered while encode() is still blocked
                other = await c.post("/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 2}})
                got = (health.status, other.status, await other.json())
                tok.release.set()
                r = await slow
                return got, r.status, (await r.json())["text"], threading.get_ident()

    (health, other, other_body), slow_status, slow_text, loop_thread = asyncio.run(asyncio.wait_for(go(), 30))
    assert health == 200 and other == 200 and other_body["text"] == "ab"
    assert slow_status == 200 and slow_text == "ab"
    assert tok.threads and all(t != loop_thread for t in tok.threads)
