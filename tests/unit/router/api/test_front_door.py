"""The router's front door on a real socket (issue 31 items 2 and 3a): slow heads and bodies are cut off,
idle kept-alive connections closed, connections and requests capped (503/429 with Retry-After), a
normal client served beside 200 slowloris connections, and a non-streamed client that goes away ends
every role's copy. Timeouts are tiny (0.2 s) where a test waits for one to fire; every wait is on the
server's observable state (a closed socket, a counter), with a generous safety net."""

from __future__ import annotations

import asyncio
import json

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api import front_door
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
from sglang_pdd.router.api.front_door import FrontDoorConfig
from tests.unit.router.kit.front_door import (connect, metrics_text, refused, request, response, served, until,
                                              until_closed)

GEN = json.dumps({"text": "ab", "sampling_params": {"max_new_tokens": 2}}).encode()
SLOW_HEAD = b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: "
SLOW_BODY = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 60000000\r\n\r\n{")


def run(coro):
    return asyncio.run(coro)


async def trickle(w: asyncio.StreamWriter, data: bytes) -> None:
    """Send `data` a byte at a time, until the server closes the connection."""
    for b in data:
        w.write(bytes([b]))
        try:
            await w.drain()
        except ConnectionError:
            return
        await asyncio.sleep(0.02)


def test_a_head_not_complete_in_time_is_closed():
    async def go():
        async with served(header_timeout_s=0.2) as (app, port):
            r1, w1 = await connect(port, SLOW_HEAD)  # headers begun, never finished
            r2, w2 = await connect(port)  # nothing sent at all
            r3, w3 = await connect(port)  # headers a byte at a time: each byte does not restart the clock
            slow = asyncio.ensure_future(trickle(w3, SLOW_HEAD + b"x" * 10_000))
            assert await until_closed(r1) == b"" and await until_closed(r2) == b""
            assert await until_closed(r3) == b""
            slow.cancel()
            counts = refused(await metrics_text(port))
            for w in (w1, w2, w3):
                w.close()
            return counts
    assert run(go())["header-timeout"] == 3


def test_a_body_not_received_in_time_is_a_408_and_closed():
    async def go():
        async with served(body_timeout_s=0.2) as (app, port):
            r, w = await connect(port, SLOW_BODY)  # 60 MB announced, one byte sent
            got = await until_closed(r)
            w.close()
            return got, refused(await metrics_text(port))
    got, counts = run(go())
    assert got.startswith(b"HTTP/1.1 408"), got[:100]
    assert b"--body-timeout-s" in got
    assert counts["body-timeout"] == 1


def test_a_kept_alive_connection_idle_after_its_response_is_closed():
    async def go():
        async with served(keepalive_timeout_s=0.2) as (app, port):
            r, w = await connect(port, request("GET", "/health"))
            status, headers, _ = await response(r)
            assert headers.get("connection", "").lower() != "close"  # kept alive
            assert await until_closed(r) == b""
            w.close()
            r2, w2 = await connect(port, request("GET", "/health"))  # a second request begun, never finished
            second = await response(r2)
            w2.write(b"GET /health HTTP/1.1\r\nHo")
            assert await until_closed(r2) == b""
            w2.close()
            return status, second[0]
    assert run(go()) == (200, 200)


def test_a_normal_client_is_served_beside_200_slowloris_connections():
    async def go():
        async with served() as (app, port):  # long timeouts: the slow ones stay open throughout
            slow = [await connect(port, SLOW_HEAD if i % 2 else SLOW_BODY) for i in range(200)]
            await until(lambda: app.door.open == 200, "200 slow connections open")
            r, w = await connect(port, request("POST", "/generate", GEN))
            app.d.release.set()
            status, _, body = await response(r)
            still_open = app.door.open
            for _, sw in slow + [(r, w)]:
                sw.close()
            return status, json.loads(body), still_open
    status, body, still_open = run(go())
    assert status == 200 and body["text"] == "hi"
    assert still_open == 201  # the slow ones were all still there while it was served


def test_over_max_connections_a_new_connection_gets_503_and_is_closed():
    async def go():
        async with served(max_connections=3) as (app, port):
            held = [await connect(port) for _ in range(3)]
            await until(lambda: app.door.open == 3, "3 connections open")
            r, w = await connect(port, request("GET", "/health"))
            got = await until_closed(r)
            w.close()
            held[0][1].close()
            await until(lambda: app.door.open == 2, "a connection closed")
            r2, w2 = await connect(port, request("GET", "/metrics"))  # room again
            status, _, body = await response(r2)
            for _, hw in held[1:] + [(r2, w2)]:
                hw.close()
            return got, status, refused(body.decode())
    got, status, counts = run(go())
    assert got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in got and b"--max-connections" in got, got
    assert status == 200 and counts["connections"] == 1


def test_in_flight_caps_total_503_and_per_client_429_with_retry_after():
    async def go():
        keys = ("k1", "k2", "k3")
        async with served(max_in_flight=2, max_in_flight_per_client=1, app_kw={"api_keys": keys}) as (app, port):
            def gen(key):
                return request("POST", "/generate", GEN, {"Authorization": f"Bearer {key}"})
            held = [await connect(port, gen("k1"))]
            await until(lambda: app.d.started == 1, "k1's request held")
            r, w = await connect(port, gen("k1"))  # k1 has its one
            per_client = await response(r)
            held.append(await connect(port, gen("k2")))
            await until(lambda: app.d.started == 2, "k2's request held")
            r2, w2 = await connect(port, gen("k3"))  # the router has its two
            total = await response(r2)
            r3, w3 = await connect(port, request("GET", "/health"))  # probes are not counted
            health = await response(r3)
            app.d.release.set()
            done = [(await response(hr))[0] for hr, _ in held]
            counts = refused(await metrics_text(port))
            for _, cw in held + [(r, w), (r2, w2), (r3, w3)]:
                cw.close()
            return per_client, total, health, done, counts
    per_client, total, health, done, counts = run(go())
    assert per_client[0] == 429 and per_client[1]["retry-after"] == "1"
    assert b"--max-in-flight-per-client" in per_client[2]
    assert total[0] == 503 and total[1]["retry-after"] == "1" and b"--max-in-flight" in total[2]
    assert health[0] == 200 and done == [200, 200]
    assert counts["per-client"] == 1 and counts["in-flight"] == 1


def test_per_client_cap_counts_by_address_without_api_keys():
    async def go():
        async with served(max_in_flight_per_client=1) as (app, port):
            held = await connect(port, request("POST", "/generate", GEN))
            await until(lambda: app.d.started == 1, "one request held")
            r, w = await connect(port, request("POST", "/generate", GEN))
            status = (await response(r))[0]
            app.d.release.set()
            await response(held[0])
            for cw in (held[1], w):
                cw.close()
            return status
    assert run(go()) == 429


def test_a_non_streamed_client_that_goes_away_closes_the_dispatchers_stream():
    """The handler is cancelled when its client disconnects (aiohttp's handler_cancellation): the
    dispatcher's stream is closed then, not when the request would have ended."""
    async def go():
        async with served() as (app, port):
            r, w = await connect(port, request("POST", "/generate", GEN))
            await until(lambda: app.d.started == 1, "the request reached the dispatcher")
            w.close()
            await until(lambda: app.d.closed == 1, "the dispatcher's stream closed after the client left")
            return app.in_flight.total
    assert run(go()) == 0


def test_a_non_streamed_client_that_goes_away_aborts_every_roles_copy():
    """The same through the real dispatcher in front of fake sglang roles: MD streams a token and hangs
    (its idle deadline far away); the client leaves; the router aborts P's and MD's copies."""
    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = fu.stream_then([fu.chunk([fu.token(0)], None, False)], then="hang")
            cl.prefill.behaviour = fu.hang()
            cfg = DispatchConfig("direct", request_timeout_s=600, bandwidth_poll_s=0, load_poll_s=0, health_check_s=0,
                                 idle_timeout_s={r: 600.0 for r in ("prefill", "relay", "main")}, migration_limit=0)
            tok = fu.CharTokenizer()
            d = Dispatcher(*cl.pools(), cfg, decode=tok.decode)
            app = RouterApp(d, tok, "m", door=FrontDoorConfig())
            runner, site = await front_door.start(app.app, app.door, "127.0.0.1", 0)
            try:
                body = json.dumps({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 64}}).encode()
                r, w = await connect(site.port, request("POST", "/generate", body))
                await until(lambda: cl.main.bodies and cl.prefill.bodies, "P and MD have the request")
                w.close()
                await until(lambda: cl.main.aborts and cl.prefill.aborts, "P's and MD's copies aborted")
                return cl.main.bodies[0]["rid"], cl.main.aborts, cl.prefill.aborts
            finally:
                await runner.cleanup()
    rid, md_aborts, p_aborts = run(go())
    assert md_aborts == [rid] and len(p_aborts) == 1


def test_front_door_series_on_metrics():
    async def go():
        async with served(max_connections=7, max_in_flight=5, max_in_flight_per_client=3) as (app, port):
            return await metrics_text(port)
    from sglang_pdd.server.metrics import parse_exposition

    text = run(go())
    limits = {dict(k)["limit"]: v for k, v in parse_exposition(text, "sglang_pdd_router_limit").items()}
    assert limits == {"connections": 7, "in-flight": 5, "per-client": 3, "tokenizer-queue": 68,
                      "body-bytes": 256 << 20, "grammar-queue": 10}
    assert parse_exposition(text, "sglang_pdd_router_open_connections")[()] == 1  # the scrape's own
    assert parse_exposition(text, "sglang_pdd_router_in_flight")[()] == 0
    assert set(refused(text)) == {"connections", "in-flight", "per-client", "tokenizer-queue", "header-timeout",
                                  "body-timeout", "auth", "body-budget", "grammar-queue"}


@pytest.mark.parametrize("field, value, flag", [("header_timeout_s", 0, "--header-timeout-s"),
                                                ("body_timeout_s", -1, "--body-timeout-s"),
                                                ("keepalive_timeout_s", 0, "--keepalive-timeout-s"),
                                                ("max_connections", 0, "--max-connections"),
                                                ("max_in_flight", 0, "--max-in-flight"),
                                                ("max_in_flight_per_client", 0, "--max-in-flight-per-client")])
def test_a_bad_limit_is_refused_naming_its_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        FrontDoorConfig(**{field: value})
