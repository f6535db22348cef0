"""The router's CPU per output token as outputs grow: flat means O(1) work per token on its one event loop.

    python -m sglang_pdd.lab.micro.router_token_cost [--outputs 1024 4096 16384] [--requests 2] [--top-logprobs 20]

Two processes beside this client: a fake MD (and P) streaming deltas (sglang's
`--incremental-streaming-output`) whose every token carries its logprob and a row of `--top-logprobs`
top logprobs, and the router (a real `Dispatcher` and `RouterApp` with sglang's own OpenAI chat layer
over the tiny test model's tokenizer, pipeline P->MD). This client sends OpenAI chat requests with
`logprobs: true, top_logprobs: N`, streamed and whole, for each output length, and reads the router
process's CPU seconds from /proc around each row. Printed per row: router CPU per output token (us) and
its ratio to the first row's. Work that grows with the output (a list rebuilt at every delta) shows as
a ratio that grows with the length: before issue 47, 600 tokens with 20 top logprobs cost the router
13.6 s and 2,400 tokens 173 s. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import functools
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time

from sglang_pdd.lab.micro.router_bench import _cpu_s, _wait_up
from sglang_pdd.lab.testing.servers import free_port

WORDS = list(range(300, 360))  # ordinary tokens of the tiny tokenizer: the output cycles through them


def _stream_tokens(top: int):
    """A fake MD's behaviour: the request's max_new_tokens as deltas of one token, each with its logprob
    (and a row of `top` when the request asks for top logprobs), as sglang streams them."""
    from sglang_pdd.lab.testing import fake_upstream as fu

    async def answer(request, body):
        n = body["sampling_params"]["max_new_tokens"]
        rows = int(body.get("top_logprobs_num") or 0)
        resp = await fu.start_stream(request)
        for i in range(n):
            t = WORDS[i % len(WORDS)]
            meta = {"finish_reason": {"type": "length", "length": n} if i == n - 1 else None,
                    "completion_tokens": i + 1, "output_token_logprobs": [[-0.5, t, None]]}
            if rows:
                meta["output_top_logprobs"] = [[[-0.5 - j / 100, WORDS[(i + j) % len(WORDS)], None]
                                                for j in range(min(rows, top))]]
            await resp.write(fu._sse({"text": "", "output_ids": [t], "meta_info": meta}))
        await resp.write(b"data: [DONE]\n\n")
        return resp
    return answer


def _serve_roles(ports: list[int], top: int) -> None:
    from aiohttp import web

    from sglang_pdd.lab.testing.fake_upstream import FakeRole

    async def main():
        for role, port in zip(("prefill", "main"), ports):
            fake = FakeRole(role, incremental=True)
            if role == "main":
                fake.behaviour = _stream_tokens(top)
            runner = web.AppRunner(fake.app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_router(ports: list[int], port: int, model_dir: str) -> None:
    from aiohttp import web

    from sglang_pdd.router.api.admission import ModelLimits
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI
    from sglang_pdd.router.app import RouterApp
    from sglang_pdd.router.peers.pool import Peer, PeerPool
    from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher

    url = [f"http://127.0.0.1:{p}" for p in ports]
    layer = SglangOpenAI(OpenAIConfig(model_dir, "tiny"))
    tok = layer.tokenizer
    d = Dispatcher(PeerPool("prefill", [Peer(url[0], bootstrap_port=1)]), PeerPool("relay", []),
                   PeerPool("main", [Peer(url[1])]),
                   DispatchConfig("direct", bandwidth_poll_s=0, load_poll_s=0, health_check_s=0),
                   decode=functools.partial(tok.decode, skip_special_tokens=True))
    app = RouterApp(d, tok, "tiny", limits=ModelLimits(vocab_size=len(tok), context_len=1 << 16), openai=layer)
    web.run_app(app.app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _chat(url: str, n: int, top: int, stream: bool) -> int:
    """One chat request of `n` output tokens; the tokens the client got logprobs for."""
    import aiohttp

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": n,
            "logprobs": True, "top_logprobs": top, "stream": stream}
    async with aiohttp.ClientSession(read_bufsize=1 << 22) as s:
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {await r.text()}")
            if not stream:
                got = await r.json()
                return len(got["choices"][0]["logprobs"]["content"])
            import json

            tokens = 0
            async for line in r.content:
                if line.startswith(b"data: {"):
                    lp = (json.loads(line[6:])["choices"] or [{}])[0].get("logprobs")
                    tokens += len(lp["content"]) if lp else 0
            return tokens


def run(outputs: list[int], requests: int, top: int, model_dir: str) -> list[dict]:
    ctx = mp.get_context("spawn")
    ports, rport = [free_port() for _ in range(2)], free_port()
    roles = ctx.Process(target=_serve_roles, args=(ports, top), daemon=True)
    router = ctx.Process(target=_serve_router, args=(ports, rport, model_dir), daemon=True)
    roles.start()
    router.start()
    out = []
    try:
        rurl = f"http://127.0.0.1:{rport}"
        asyncio.run(_wait_up(rurl))
        asyncio.run(_chat(rurl, 64, top, True))  # warm: sglang's layer, the tokenizer
        for n in outputs:
            cpu0, t0, got = _cpu_s(router.pid), time.perf_counter(), 0
            for i in range(requests):
                got += asyncio.run(_chat(rurl, n, top, stream=i % 2 == 0))
            cpu = max(_cpu_s(router.pid) - cpu0, 1 / os.sysconf("SC_CLK_TCK"))
            if got != n * requests:
                raise RuntimeError(f"{got} of {n * requests} tokens came back with logprobs")
            out.append({"output": n, "requests": requests, "cpu_s": cpu, "wall_s": time.perf_counter() - t0,
                        "cpu_us_token": 1e6 * cpu / (n * requests)})
    finally:
        for p in (router, roles):
            p.kill()
            p.join()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.micro.router_token_cost",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--outputs", type=int, nargs="+", default=[1024, 4096, 16384],
                    help="output lengths, one row each (default: 1024 4096 16384)")
    ap.add_argument("--requests", type=int, default=2,
                    help="requests per row, streamed and whole in turn (default: 2)")
    ap.add_argument("--top-logprobs", type=int, default=20, help="top logprobs per token (default: 20, OpenAI's most)")
    ap.add_argument("--model-dir", default=None,
                    help="the tiny test model's directory (default: built into a cache under the temp dir)")
    args = ap.parse_args(argv)
    if args.requests < 1 or min(args.outputs) < 1:
        ap.error("--requests and --outputs must be at least 1")
    model_dir = args.model_dir
    if model_dir is None:
        from sglang_pdd.lab.testing.tiny_model import build_cached

        model_dir = build_cached(os.path.join(tempfile.gettempdir(), "sglang-pdd-models"))
    rows = run(args.outputs, args.requests, args.top_logprobs, model_dir)
    print(f"| output tokens | requests | router CPU s | router CPU us/token | vs {rows[0]['output']} tokens |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['output']} | {r['requests']} | {r['cpu_s']:.2f} | {r['cpu_us_token']:.0f} | "
              f"{r['cpu_us_token'] / rows[0]['cpu_us_token']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
