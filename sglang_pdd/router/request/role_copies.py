"""Each role's copy of one request, as a task of its own: its chunks go to a bounded queue, its
failure to every queue that must hear it, and at the end every copy the request reached is aborted
(unless it ended normally), except the copies left to finish on their own (MD landing its KV)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from sglang_pdd.router.peers import upstream
from sglang_pdd.router.peers.pool import Peer
from sglang_pdd.router.request import idle_deadline
from sglang_pdd.router.request.dispatch_config import DispatchConfig
from sglang_pdd.router.request.failure import timed_out
from sglang_pdd.router.request.migration import rules as migration

logger = logging.getLogger(__name__)

# Chunks of one role's stream queued for the client at most: past this the role's stream is not read,
# so a slow client pushes back on the role over TCP instead of growing the router's memory.
QUEUE_CHUNKS = 64
Call = tuple[str, Peer, dict]  # (role, peer, the role's body)


class RoleCopies:
    def __init__(self, cfg: DispatchConfig, session: Callable[[], aiohttp.ClientSession]):
        """`session`: the router's HTTP session to its peers (it exists once the services started)."""
        self.cfg, self._session = cfg, session
        self.background: set[asyncio.Task] = set()  # MD copies left to land their KV
        self.releasing: set[asyncio.Task] = set()  # requests' clean-ups (`release`)

    async def close(self) -> None:
        await asyncio.gather(*self.releasing, return_exceptions=True)

    def start(self, calls: list[Call], deadline: float) -> tuple[dict[str, asyncio.Queue], list[asyncio.Task]]:
        """One task per role's copy; RLD's and MD's chunks go to a queue each. P's failure ends the
        request too (it goes to every queue): without P's KV no role can go on."""
        queues = {name: asyncio.Queue(maxsize=QUEUE_CHUNKS) for name, _, _ in calls if name != "prefill"}
        tasks = [asyncio.create_task(self._run(name, peer, body, [queues[name]] if name in queues
                                               else list(queues.values()), deadline)) for name, peer, body in calls]
        return queues, tasks

    async def release_shielded(self, calls: list[Call], tasks: list[asyncio.Task], done: bool) -> None:
        """`release`, shielded: a handler cancelled while it lets go (the client's connection dropped
        just after a write to it failed) must still abort every role's copy."""
        release = asyncio.ensure_future(self.release(calls, tasks, done))
        self.releasing.add(release)
        release.add_done_callback(self.releasing.discard)
        await asyncio.shield(release)

    async def release(self, calls: list[Call], tasks: list[asyncio.Task], done: bool) -> None:
        """Cancel the request's role tasks and abort its copies on every role it reached (unless it
        ended normally), except the copies left to finish on their own."""
        mine = [(body, peer, t) for (_, peer, body), t in zip(calls, tasks) if t not in self.background]
        pending = [t for _, _, t in mine if not t.done()]
        for t in pending:
            t.cancel()
        if pending or not done:
            await asyncio.gather(*(upstream.abort(self._session(), peer.url, body["rid"]) for body, peer, _ in mine),
                                 return_exceptions=True)
        await asyncio.gather(*(t for _, _, t in mine), return_exceptions=True)

    def leave_running(self, tasks: list[asyncio.Task], queues: list[asyncio.Queue]) -> None:
        """Let these requests finish on their own (bounded by the request timeout); nobody reads them:
        their queues are emptied once, which wakes a copy blocked on a full one, and it queues no more."""
        for t in tasks:
            self.background.add(t)
            t.add_done_callback(self.background.discard)
        for q in queues:
            while not q.empty():
                q.get_nowait()

    async def _run(self, role: str, peer: Peer, body: dict, to: list[asyncio.Queue], deadline: float) -> None:
        """One role's copy: its chunks go to its queue; however it fails, the failure goes to every
        queue in `to`, so that whoever drains one ends the client's request instead of waiting. The
        request's deadline ending it is the client's 504, not the peer's failure."""
        loop, mark = asyncio.get_running_loop(), peer.health.progress
        peer.in_flight += 1
        try:
            if role == "prefill":  # P answers once its KV went out; its reply carries nothing the client sees
                await upstream.post_json(self._session(), role, peer.url, "/generate", body,
                                         max(0.001, min(self.cfg.idle(role), deadline - loop.time())))
                peer.health.progressed()
                peer.health.succeeded()
                return
            left = max(0.001, deadline - loop.time())
            async for chunk in upstream.stream_generate(self._session(), role, peer.url, body, left):
                peer.health.progressed()
                if asyncio.current_task() not in self.background:  # a full queue stops reading the role
                    await to[0].put(chunk)
            peer.health.succeeded()
        except Exception as e:
            if isinstance(e, upstream.UpstreamError) and e.kind == "timeout" and loop.time() >= deadline - 0.01:
                e = timed_out(self.cfg.request_timeout_s)
            elif isinstance(e, upstream.UpstreamError):
                self._count_failure(peer, e, silent=idle_deadline.silent(mark, peer.health.progress))
                logger.info("%s copy of %s ended with %s", role, body.get("rid"), e)
            else:
                logger.exception("%s copy of %s failed", role, body.get("rid"))
            for q in to:
                if asyncio.current_task() not in self.background:
                    await q.put(e)
        finally:
            peer.in_flight -= 1

    def _count_failure(self, peer: Peer, e: upstream.UpstreamError, silent: bool = True) -> None:
        """A copy that failed on its own counts against its peer's health; not a client's error (4xx),
        not a copy left to finish in the background (RLD's Finished aborts MD's), not P's late reply
        while P answered others (`idle_deadline`)."""
        if asyncio.current_task() in self.background or migration.cause_of(e) is None:
            return
        if e.kind == "timeout" and not silent:
            return
        if peer.health.failed(unreachable=e.kind == "unreachable"):
            logger.warning("%s %s is out of service after %d failures in a row", e.role, peer.url,
                           peer.health.failures)
