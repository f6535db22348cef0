"""A real PDD router in front of fake P/RLD/MD roles (sglang_pdd.testing.fake_upstream), served from
a background thread so that synchronous clients (the OpenAI SDK, requests) can talk to it."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from sglang_pdd.testing import fake_upstream as fu


@contextlib.contextmanager
def running_router(pipeline: str = "direct", cluster: fu.FakeCluster | None = None, start_timeout_s: float = 30.0):
    """Yields (base URL of the router, the FakeCluster whose roles record every body)."""
    box: dict = {}
    ready = threading.Event()

    async def serve():
        box["stop"] = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        try:
            async with (cluster or fu.FakeCluster()) as cl, fu.router_client(cl, pipeline=pipeline) as c:
                box["url"], box["cluster"] = str(c.make_url("")).rstrip("/"), cl
                ready.set()
                await box["stop"].wait()
        except BaseException as e:  # surfaced to the test, not lost in the thread
            box["error"] = e
            ready.set()

    t = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    t.start()
    assert ready.wait(start_timeout_s), "the router did not start"
    if "error" in box:
        raise box["error"]
    try:
        yield box["url"], box["cluster"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        t.join(start_timeout_s)
