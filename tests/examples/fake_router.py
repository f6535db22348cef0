"""A real PDD router in front of fake P/RLD/MD roles (sglang_pdd.lab.testing.fake_upstream), served from
a background thread so that synchronous clients (the OpenAI SDK, requests) can talk to it; or the
fake roles alone, for a router started as its own process."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from sglang_pdd.lab.testing import fake_upstream as fu


@contextlib.contextmanager
def _in_thread(serve_until, start_timeout_s: float):
    """Runs `serve_until(box, ready, stop)` on its own event loop in a thread; yields what it put in box."""
    box: dict = {}
    ready = threading.Event()

    async def serve():
        box["stop"] = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        try:
            await serve_until(box, ready, box["stop"])
        except BaseException as e:  # surfaced to the test, not lost in the thread
            box["error"] = e
            ready.set()

    t = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    t.start()
    assert ready.wait(start_timeout_s), "the servers did not start"
    if "error" in box:
        raise box["error"]
    try:
        yield box
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        t.join(start_timeout_s)


@contextlib.contextmanager
def running_router(pipeline: str = "direct", cluster: fu.FakeCluster | None = None, start_timeout_s: float = 30.0):
    """Yields (base URL of the router, the FakeCluster whose roles record every body)."""
    async def serve_until(box, ready, stop):
        async with (cluster or fu.FakeCluster()) as cl, fu.router_client(cl, pipeline=pipeline) as c:
            box["url"], box["cluster"] = str(c.make_url("")).rstrip("/"), cl
            ready.set()
            await stop.wait()

    with _in_thread(serve_until, start_timeout_s) as box:
        yield box["url"], box["cluster"]


@contextlib.contextmanager
def running_roles(cluster: fu.FakeCluster | None = None, start_timeout_s: float = 30.0):
    """Yields the started FakeCluster (its `urls`: P, RLD, MD on loopback ports)."""
    async def serve_until(box, ready, stop):
        async with (cluster or fu.FakeCluster()) as cl:
            box["cluster"] = cl
            ready.set()
            await stop.wait()

    with _in_thread(serve_until, start_timeout_s) as box:
        yield box["cluster"]
