"""What the front-door tests share: the router (RouterApp) served through its front door on a real
127.0.0.1 socket, a dispatcher that holds each request until released, and raw connections."""

from __future__ import annotations

import asyncio
import contextlib

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.router.api import front_door
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.api.front_door import FrontDoorConfig
from sglang_pdd.router.peers.pool import PeerPool
from sglang_pdd.router.request.stitch import Delta

SAFETY_S = 30.0  # a safety net for a wait on observable state, never an assertion of speed
LONG = dict(header_timeout_s=600, body_timeout_s=600, keepalive_timeout_s=600)


class HoldingDispatcher:
    """Each request streams one token, then waits for `release` before it ends; records every request
    that started and every one whose stream was closed (what the real dispatcher aborts on)."""

    prefill = relay = main = PeerPool("main", [])
    policy = None
    kv_subscribers = ()  # no MD publishes KV events here
    pool_signal = None  # no relay pool scale signal (no --ttft-slo-secs)

    def __init__(self):
        self.release = asyncio.Event()
        self.started, self.closed = 0, 0

    async def start(self):
        pass

    async def close(self):
        pass

    async def generate(self, ids, sp, extra, outcome, pipeline=None):
        self.started += 1
        try:
            yield Delta([104], "h")
            await self.release.wait()
            yield Delta([105], "i", {"type": "length"})
        finally:
            self.closed += 1


@contextlib.asynccontextmanager
async def served(dispatcher=None, tokenizer=None, app_kw: dict | None = None, **door):
    """(RouterApp, port) of a router served through its front door on 127.0.0.1; `door`: FrontDoorConfig
    fields (timeouts long unless given), `app_kw`: RouterApp's other arguments."""
    app = RouterApp(dispatcher or HoldingDispatcher(), tokenizer or fu.CharTokenizer(), "m",
                    door=FrontDoorConfig(**{**LONG, "lingering_s": 0.2, **door}), **(app_kw or {}))
    runner, site = await front_door.start(app.app, app.door, "127.0.0.1", 0)
    try:
        yield app, site.port
    finally:
        await runner.cleanup()


async def until(cond, what: str) -> None:
    """Wait until cond() holds (polled on the loop; SAFETY_S is a safety net)."""
    async def poll():
        while not cond():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(poll(), SAFETY_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"never: {what}") from None


async def connect(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    if data:
        w.write(data)
        await w.drain()
    return r, w


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection (EOF or reset)."""
    got = b""
    async def read():
        nonlocal got
        try:
            while chunk := await reader.read(65536):
                got += chunk
        except ConnectionError:
            pass
    try:
        await asyncio.wait_for(read(), SAFETY_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"the server never closed the connection (got {got[:200]!r})") from None
    return got


def request(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    h = {"Host": "x", "Content-Length": str(len(body)), **({"Content-Type": "application/json"} if body else {}),
         **(headers or {})}
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + body


async def response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SAFETY_S)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), SAFETY_S)
    return status, headers, body


def refused(metrics_text: str) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in parse_exposition(metrics_text, "sglang_pdd_router_refused_total").items()}


async def metrics_text(port: int) -> str:
    r, w = await connect(port, request("GET", "/metrics"))
    try:
        _, _, body = await response(r)
        return body.decode()
    finally:
        w.close()
