"""The router's front door: how long a client may take to send its request, and how many connections
it may hold open.

aiohttp's server reads a request's head and body with no deadline of its own (a client sending one
byte now and then holds a connection, and a request, forever). Here:

* a connection whose first request head (request line and headers) is not complete
  `header_timeout_s` after it opened is closed (`refused{reason="header-timeout"}`); a kept-alive
  connection must send its next complete head within `keepalive_timeout_s` of the last response
  (aiohttp closes a connection that is idle or mid-head then);
* a body not received within `body_timeout_s` of its head is answered 408 and the connection closed
  (`read_body`, `refused{reason="body-timeout"}`);
* over `max_connections` open connections, a new one is answered 503 with Retry-After and closed at
  once (`refused{reason="connections"}`).

The head deadline sits on the connection (`_Connection`, aiohttp's `RequestHandler` with a timer), so the
router serves through `FrontDoorSite` (`serve`, `start`) rather than `web.run_app`; the runner cancels a
handler whose client went away (`handler_cancellation`), so the dispatcher aborts every role's copy of a
request the client left, streamed or not. Request caps and client keys are `router.api.in_flight` and
`router.api.client_auth`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web

logger = logging.getLogger(__name__)

# The head deadline reads how many request heads aiohttp's parser completed on the connection.
if "_request_count" not in getattr(web.RequestHandler, "__slots__", ()):  # pragma: no cover - an aiohttp change
    raise ImportError("sglang_pdd.router.api.front_door: this aiohttp's RequestHandler has no _request_count, "
                      "which the header timeout reads (aiohttp 3.14 has it)")


@dataclass(frozen=True)
class FrontDoorConfig:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 30.0
    max_connections: int = 4096
    max_in_flight: int = 1024
    max_in_flight_per_client: int = 256
    retry_after_s: int = 1  # the Retry-After of every 503/429 the front door sends
    lingering_s: float = 10.0  # aiohttp's: read (and drop) a refused request's unread body this long

    def __post_init__(self):
        for flag, v in (("--header-timeout-s", self.header_timeout_s), ("--body-timeout-s", self.body_timeout_s),
                        ("--keepalive-timeout-s", self.keepalive_timeout_s)):
            if not v > 0:
                raise ValueError(f"{flag} must be positive, got {v}")
        for flag, v in (("--max-connections", self.max_connections), ("--max-in-flight", self.max_in_flight),
                        ("--max-in-flight-per-client", self.max_in_flight_per_client)):
            if v < 1:
                raise ValueError(f"{flag} must be 1 or more, got {v}")


def _canned_503(retry_after_s: int, message: str) -> bytes:
    body = ('{"error": {"message": "%s", "code": 503}}' % message).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            + f"Retry-After: {retry_after_s}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body)


class FrontDoor:
    """The connection-level limits of one router: the open-connection count and each connection's head
    deadline. `metrics`: a `RouterMetrics` (refusals by reason)."""

    def __init__(self, cfg: FrontDoorConfig, metrics):
        self.cfg, self.metrics = cfg, metrics
        self.open = 0
        self.full_reply = _canned_503(cfg.retry_after_s, f"the router has its limit of {cfg.max_connections} open "
                                                    "connections (--max-connections); retry later")

    def connection(self, server: web.Server) -> "_Connection":
        """asyncio's protocol factory for one accepted connection."""
        return _Connection(server, self, loop=asyncio.get_running_loop(),
                           keepalive_timeout=self.cfg.keepalive_timeout_s, lingering_time=self.cfg.lingering_s)

    def refuse(self, reason: str) -> None:
        self.metrics.refused.labels(reason).inc()


class _Connection(web.RequestHandler):
    """aiohttp's connection handler, counted against --max-connections, closed when its first request
    head is not complete in time."""

    def __init__(self, manager: web.Server, door: FrontDoor, **kwargs):
        super().__init__(manager, **kwargs)
        self._door = door
        self._admitted = False
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        door = self._door
        if door.open >= door.cfg.max_connections:
            door.refuse("connections")
            transport.write(door.full_reply)
            transport.close()  # after the 503 is written
            return
        self._admitted = True
        door.open += 1
        super().connection_made(transport)
        self._head_deadline = asyncio.get_running_loop().call_later(door.cfg.header_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_deadline = None
        if self._request_count == 0 and self.transport is not None:
            self._door.refuse("header-timeout")
            self.force_close()

    def close_now(self) -> None:
        """Close the connection as soon as the current response is written (no lingering read of the
        rest of its body): for a client too slow to send its body."""
        self._lingering_time = 0.0
        self.close()

    def connection_lost(self, exc) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._door.open -= 1
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        super().connection_lost(exc)


async def read_body(request: web.Request, door: FrontDoor, budget=None) -> bytes | web.Response:
    """The request's whole body, or the error response: 413 over the body limit, 408 when it did not
    arrive within --body-timeout-s (the connection then closes once the 408 is written), 503 when it
    does not fit the router's budget of body bytes (`body_budget`: taken as the bytes arrive)."""
    limit = request.client_max_size
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    parts: list[bytes] = []
    size = 0
    try:  # not wait_for: on 3.11 it can swallow the handler's cancellation (bpo-42130)
        async with asyncio.timeout(door.cfg.body_timeout_s):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > limit:
                    return _too_large(limit)
                if budget is not None and not budget.take(request, len(chunk)):
                    return budget.refusal()
                parts.append(chunk)
    except TimeoutError:
        door.refuse("body-timeout")
        close_now = getattr(request.protocol, "close_now", None)  # absent under a test server
        if close_now is not None:
            close_now()
        resp = _json_error(408, f"the body did not arrive within {door.cfg.body_timeout_s:g}s (--body-timeout-s)")
        resp.force_close()
        return resp
    return b"".join(parts)


def _too_large(limit: int) -> web.Response:
    return _json_error(413, f"the body is over the router's limit of {limit} bytes")


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class FrontDoorSite(web.BaseSite):
    """A TCP site whose connections go through the front door (`_Connection`)."""

    def __init__(self, runner: web.AppRunner, door: FrontDoor, host: str, port: int, backlog: int = 1024):
        super().__init__(runner, backlog=backlog)
        self._door, self._host, self._port = door, host, port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the kernel's choice for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self._door.connection(server), self._host, self._port, backlog=self._backlog,
            reuse_address=True)


async def start(app: web.Application, door: FrontDoor, host: str, port: int) -> tuple[web.AppRunner, FrontDoorSite]:
    """Serve `app` through `door` on host:port (0: any free port, see `site.port`); stop with
    `runner.cleanup()`."""
    runner = web.AppRunner(app, handler_cancellation=True, handle_signals=False)
    await runner.setup()
    site = FrontDoorSite(runner, door, host, port)
    await site.start()
    return runner, site


def serve(app: web.Application, door: FrontDoor, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down as `web.run_app` does (the app's cleanup runs)."""
    async def run() -> None:
        runner = web.AppRunner(app, handler_cancellation=True, handle_signals=True)
        await runner.setup()
        try:
            await FrontDoorSite(runner, door, host, port).start()
            logger.info("serving on http://%s:%d", host, port)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    except (web.GracefulExit, KeyboardInterrupt):
        pass
