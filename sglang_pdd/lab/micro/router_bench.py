"""The PDD router at sustained load, with fake upstreams (no sglang, no model).

    python -m sglang_pdd.lab.micro.router_bench [--quick] [--concurrency 8] [--incremental] [--sizing] [--scale 1]

Three processes: the fake P, RLD and MD (`testing.fake_upstream`, sglang's wire format: cumulative
`output_ids`, or deltas with `--incremental`; one chunk per token, RLD handing off to MD after 4
tokens), the router (a real
`Dispatcher` and `RouterApp`, pipeline P->RLD->MD, its MD view filled with `cache` tokens of other
prompts first), and this client. Each row runs `requests` requests, `concurrency` at a time.
Printed per row: requests/s through the router at that concurrency, the router process's CPU per
request and per streamed chunk there (from /proc), what one core of router CPU serves at that mix
(streams/s and chunks/s per core: requests and chunks divided by the router's CPU seconds), the router's
CPU share of the wall time (near 100 %: the router was the bottleneck, one event loop), and the added
latency per chunk of requests sent one at a time: (mean request time through the router - the same
requests straight from the fake MD) / chunks. Then the sizing fit over the rows that vary only the
output length: router CPU per request = a + b * chunks, least squares, so one core serves 1/a streams/s
(their fixed cost: body, admission, pipeline choice, the three role requests; prompts are sent as token
IDs, so no tokenizer's cost is in it) plus 1/b chunks/s (stitching, detokenizing, writing SSE), and a
router needs `streams/s * a + chunks/s * b` cores (examples/kubernetes/README.md, "Sizing the router").
`--incremental`: the roles stream deltas (sglang's `--incremental-streaming-output`, as
examples/kubernetes starts RLD and MD) instead of cumulative output_ids.
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import dataclass

from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.lab.testing.servers import free_port

VOCAB = 1024


@dataclass(frozen=True)
class Row:
    prompt: int  # tokens
    output: int  # tokens (= chunks)
    cache: int  # tokens in the router's MD view before the row
    requests: int


def _serve_upstreams(ports: list[int], incremental: bool) -> None:
    from aiohttp import web  # aiohttp and the router only in the spawned servers

    from sglang_pdd.lab.testing.fake_upstream import FakeRole

    async def main():
        for role, port in zip(("prefill", "relay", "main"), ports):
            runner = web.AppRunner(FakeRole(role, incremental=incremental).app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_router(ports: list[int], port: int, cache_tokens: int) -> None:
    from aiohttp import web

    from sglang_pdd.router.app import RouterApp
    from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
    from sglang_pdd.lab.testing.fake_upstream import CharTokenizer

    url = [f"http://127.0.0.1:{p}" for p in ports]
    tok = CharTokenizer()
    d = Dispatcher(PeerPool("prefill", [Peer(url[0], bootstrap_port=1)]),
                   PeerPool("relay", [Peer(url[1], token_channel="tcp://127.0.0.1:1")]),
                   PeerPool("main", [Peer(url[2])]), DispatchConfig("relay", bandwidth_poll_s=0, load_poll_s=0),
                   decode=tok.decode)
    view = d.views[url[2]]
    view.max_tokens = max(cache_tokens, 1 << 16)
    rng = random.Random(1)
    while view.tokens + 4608 <= cache_tokens:  # other conversations: a shared system prompt, then their own
        view.insert([1] * 512 + [rng.randrange(VOCAB) for _ in range(4096)])
    app = RouterApp(d, tok, "fake", limits=ModelLimits(vocab_size=VOCAB, context_len=1 << 22))
    web.run_app(app.app, host="127.0.0.1", port=port, print=None, access_log=None)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _wait_up(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        for _ in range(2400):  # the router fills its view first: up to a minute for 4M tokens
            try:
                async with s.get(url + "/health") as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


async def _load(url: str, row: Row, concurrency: int, seed: int) -> tuple[float, float, int]:
    """(wall seconds, mean request seconds, chunks) for row.requests streamed requests."""
    import aiohttp

    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(row.prompt)] for _ in range(min(row.requests, 8))]
    sem, times, chunks = asyncio.Semaphore(concurrency), [], [0]

    async def one(session, i):
        async with sem:
            t = time.perf_counter()
            body = {"input_ids": prompts[i % len(prompts)], "stream": True,
                    "sampling_params": {"max_new_tokens": row.output}}
            async with session.post(url + "/generate", json=body) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    if line.startswith(b"data:") and b"[DONE]" not in line:
                        chunks[0] += 1
            times.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     read_bufsize=1 << 22) as session:
        await asyncio.gather(*(one(session, i) for i in range(row.requests)))
    return time.perf_counter() - t0, sum(times) / len(times), chunks[0]


def run_row(row: Row, concurrency: int, incremental: bool = False) -> dict:
    ctx = mp.get_context("spawn")
    ports, rport = [free_port() for _ in range(3)], free_port()
    up = ctx.Process(target=_serve_upstreams, args=(ports, incremental), daemon=True)
    router = ctx.Process(target=_serve_router, args=(ports, rport, row.cache), daemon=True)
    up.start()
    router.start()
    try:
        rurl, md = f"http://127.0.0.1:{rport}", f"http://127.0.0.1:{ports[2]}"
        asyncio.run(_wait_up(rurl))
        asyncio.run(_wait_up(md))
        asyncio.run(_load(rurl, Row(row.prompt, row.output, row.cache, min(4, row.requests)), concurrency, 0))  # warm
        one_by_one = Row(row.prompt, row.output, row.cache, max(2, row.requests // 4))
        _, base_mean, _ = asyncio.run(_load(md, one_by_one, 1, 1))
        _, mean, _ = asyncio.run(_load(rurl, one_by_one, 1, 1))
        cpu0 = _cpu_s(router.pid)
        wall, _, chunks = asyncio.run(_load(rurl, row, concurrency, 2))
        cpu = _cpu_s(router.pid) - cpu0
    finally:
        for p in (router, up):
            p.kill()
            p.join()
    cpu = max(cpu, 1 / os.sysconf("SC_CLK_TCK"))  # /proc's resolution: one clock tick
    return {"rps": row.requests / wall, "cpu_ms_req": 1e3 * cpu / row.requests,
            "cpu_us_chunk": 1e6 * cpu / max(chunks, 1), "chunks": chunks,
            "streams_per_core_s": row.requests / cpu, "chunks_per_core_s": chunks / cpu,
            "router_cpu_share": cpu / wall,
            "added_us_chunk": 1e6 * (mean - base_mean) / max(row.output, 1)}


def fit_costs(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of cpu_per_request = a + b * chunks_per_request over (chunks, cpu seconds) points with at
    least two chunk counts: least squares of the relative error (weights 1/cpu^2), so a row of 2048-token
    requests does not drown the 16-token rows that carry `a`; a and b are at least 0 (below is noise)."""
    if len({x for x, _ in points}) < 2:
        raise ValueError("fit_costs needs requests of at least two output lengths")
    w = [1 / max(y, 1e-12) ** 2 for _, y in points]
    sw = sum(w)
    mx = sum(wi * x for wi, (x, _) in zip(w, points)) / sw
    my = sum(wi * y for wi, (_, y) in zip(w, points)) / sw
    b = sum(wi * (x - mx) * (y - my) for wi, (x, y) in zip(w, points)) / sum(
        wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points))
    b = max(b, 0.0)
    return max(my - b * mx, 0.0), b


def rows(quick: bool, scale: int = 1, sizing: bool = False) -> list[Row]:
    n = (8 if quick else 32) * scale
    out = [Row(1024, o, 0, max(4, n * 64 // o)) for o in (16, 256, 2048)]  # the sizing rows
    if not sizing:
        out = [Row(p, 64, 0, n) for p in (128, 8192, 65536)] + out
        out += [Row(1024, 64, c, n) for c in (1 << 20, 1 << 22)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.micro.router_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per row (default: off)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default: 8)")
    ap.add_argument("--incremental", action="store_true",
                    help="the fake roles stream deltas, as with sglang's --incremental-streaming-output "
                         "(default: off, cumulative output_ids)")
    ap.add_argument("--scale", type=int, default=1,
                    help="run this many times the requests of each row: more router CPU seconds to divide by "
                         "(/proc counts clock ticks) (default: 1)")
    ap.add_argument("--sizing", action="store_true",
                    help="only the rows that vary the output length, which the fit uses (default: every row)")
    args = ap.parse_args(argv)
    if args.scale < 1 or args.concurrency < 1:
        ap.error("--scale and --concurrency must be at least 1")
    head = ("prompt tok", "output tok", "cache tok", "requests", "req/s", "router CPU ms/req",
            "router CPU us/chunk", "streams/s per core", "chunks/s per core", "router CPU share",
            "added latency us/chunk (one at a time)")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    points = []
    for row in rows(args.quick, args.scale, args.sizing):
        r = run_row(row, args.concurrency, args.incremental)
        print(f"| {row.prompt} | {row.output} | {row.cache} | {row.requests} | {r['rps']:.1f} | "
              f"{r['cpu_ms_req']:.2f} | {r['cpu_us_chunk']:.0f} | {r['streams_per_core_s']:.0f} | "
              f"{r['chunks_per_core_s']:.0f} | {100 * r['router_cpu_share']:.0f} % | {r['added_us_chunk']:.0f} |",
              flush=True)
        if row.prompt == 1024 and row.cache == 0:  # the rows that vary only the output length
            points.append((r["chunks"] / row.requests, r["cpu_ms_req"] / 1e3))
    a, b = fit_costs(points)
    print(f"\nfit (prompt 1024, no cache; cumulative={not args.incremental}): router CPU per request = "
          f"{1e3 * a:.2f} ms + {1e6 * b:.0f} us per chunk; one core: {1 / a if a else float('inf'):.0f} "
          f"streams/s of fixed cost, {1 / b if b else float('inf'):.0f} chunks/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
