"""A client that leaves just as its next chunk arrives: the router's drain of a role's copy gives up
the request (issue 47). `asyncio.wait_for` on Python 3.11 swallowed a cancellation that met the awaited
item's completion (bpo-42130, fixed in 3.12): a non-streamed client that left was then drained to the
end, its slots held and no role's copy aborted. The race is driven here deterministically, the
cancellation arriving every few event-loop steps after the chunk; a drain that read the chunk and
waited for the next one is the failure."""

import asyncio

import pytest

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.router.peers.pool import Peer
from sglang_pdd.router.request.drain import drain
from sglang_pdd.router.request.outcome import Attempt
from sglang_pdd.router.request.stitch import Delta

STEPS = range(8)  # loop steps between the chunk and the cancellation: covers wait_for's window


def feed(ids, reason):
    return Delta(token_ids=list(ids), text="")


async def left_at(step: int) -> tuple[bool, int]:
    """(the drain ended cancelled, chunks it yielded) when the client leaves `step` loop steps after
    its first chunk was queued."""
    q: asyncio.Queue = asyncio.Queue()
    got: list[Delta] = []
    a = Attempt(Pipeline.P_MD, {"main": None})

    async def client():
        async for d in drain("main", q, feed, [], a, Peer("http://md:1"), 60.0, 600.0):
            got.append(d)

    task = asyncio.create_task(client())
    while not q._getters:  # the drain waits for the role's next chunk
        await asyncio.sleep(0)
    q.put_nowait({"output_ids": [7], "meta_info": {}})
    for _ in range(step):
        await asyncio.sleep(0)
    task.cancel()
    for _ in range(50):  # a cancelled drain ends within a few steps; a lost cancellation never does
        if task.done():
            break
        await asyncio.sleep(0)
    ended = task.done() and task.cancelled()
    if not task.done():
        task.cancel()  # the failure: clean up so the next case starts afresh
        await asyncio.gather(task, return_exceptions=True)
    return ended, len(got)


@pytest.mark.parametrize("step", STEPS)
def test_a_client_leaving_as_its_chunk_arrives_ends_the_drain(step):
    ended, _ = asyncio.run(left_at(step))
    assert ended, f"the cancellation {step} loop steps after the chunk was lost: the drain waits on"


def test_negative_control_wait_for_loses_the_cancellation_before_312(monkeypatch):
    """The same race through `asyncio.wait_for` (how the drain read its queue before): on Python
    3.11 some step loses the cancellation, which shows that the race is driven; from 3.12 on
    `wait_for` is built on `asyncio.timeout` and loses none."""
    import sys

    real_get = asyncio.Queue.get

    async def get_via_wait_for(self):
        return await asyncio.wait_for(real_get(self), 60.0)

    monkeypatch.setattr(asyncio.Queue, "get", get_via_wait_for)
    lost = [s for s in STEPS if not asyncio.run(left_at(s))[0]]
    assert bool(lost) == (sys.version_info < (3, 12)), lost
