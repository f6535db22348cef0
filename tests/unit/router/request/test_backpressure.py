"""A client that does not read pushes back on the role (issue 31): the router queues at most
`QUEUE_CHUNKS` chunks of a role's stream for it, then stops reading the role, instead of buffering
the whole output; once the client reads again every token arrives, once, in order."""

import asyncio

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.request import role_copies
from sglang_pdd.router.request.dispatch import Outcome
from tests.unit.router.kit.dispatch_client import config, router
from tests.unit.router.kit.fixed_model import model, run

N = 300  # chunks MD streams (one token each): far more than the queue holds
CAP = 4


def test_a_client_that_does_not_read_leaves_at_most_the_cap_queued(monkeypatch):
    monkeypatch.setattr(role_copies, "QUEUE_CHUNKS", CAP)
    seen: list = []
    start = role_copies.RoleCopies.start

    def recording_start(self, calls, deadline):
        queues, tasks = start(self, calls, deadline)
        seen.append(queues)
        return queues, tasks

    monkeypatch.setattr(role_copies.RoleCopies, "start", recording_start)

    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = model()
            async with router(cl, config()) as (_client, d):
                stream = d.generate([5, 6, 7], {"max_new_tokens": N}, {}, Outcome())
                got = list((await stream.__anext__()).token_ids)  # the client read one delta, then stops
                q = seen[0]["main"]
                while q.qsize() < CAP:  # the role's task fills the queue...
                    await asyncio.sleep(0.01)
                for _ in range(200):  # ...and, given every chance to run, queues no more
                    await asyncio.sleep(0)
                most = q.qsize()
                async for delta in stream:  # the client reads again
                    got += delta.token_ids
                return most, got

    most, got = run(go())
    assert most == CAP
    assert got == [fu.token(3 + i) for i in range(N)]
