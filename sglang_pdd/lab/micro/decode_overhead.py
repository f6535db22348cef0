"""What the plugin costs a decode step: MainDecode (`--pdd-role main`) against plain sglang decode.

    python -m sglang_pdd.lab.micro.decode_overhead [--batch 8] [--tokens 256] [--repeat 3] [--with-overlap] [--json OUT]

One plain prefill server feeds decode servers on loopback that are identical but for `--pdd-role main`
(all with the decode radix cache, as MD runs, and the same idle wait, `--pdd-idle-wait-ms`, so the
comparison is of the hooks, not of spinning): `plain` and `main` on sglang's non-overlap loop and, with
`--with-overlap`, `plain-overlap` and `main-overlap` on its overlap loop (sglang's default). Each repeat
sends the same batch of `--batch` concurrent requests (P->decode, greedy, exactly `--tokens` output
tokens each) to every server, one server at a time, in an order that alternates between repeats (ABBA).
Decode throughput of a batch = output tokens after each request's first / (last chunk of any request -
first chunk of any request), from the streams the decode servers send. Printed: each server's median
(min-max) and its ratio to the plain server of the same loop, per repeat. On CPU the ratio says what
the plugin's per-step hooks cost; run the same script on a GPU box for the figure that matters.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import threading
import time

from sglang_pdd.lab.testing.client import generate, greedy_body, sse_chunks
from sglang_pdd.config import ROLE_IDLE_WAIT_MS
from sglang_pdd.lab.testing.launch_args import ServerConfig
from sglang_pdd.lab.testing.prompts import PromptMaker
from sglang_pdd.lab.testing.servers import ServerGroup, free_port
from sglang_pdd.lab.testing.tiny_model import build_cached

HOST = "127.0.0.1"


IDLE_WAIT_MS = ROLE_IDLE_WAIT_MS  # MD's default; the plain servers get the same


def baseline(name: str) -> str:
    """The plain server a decode server is compared with: the one on the same scheduler loop."""
    return "plain-overlap" if name.endswith("overlap") else "plain"


def batch_throughput(prefill: str, decode: str, boot: int, prompts: list[list[int]], tokens: int) -> float:
    """Decode tokens per second of one concurrent batch (see the module docstring)."""
    firsts, lasts, counts, errors = [], [], [], []

    def one(ids: list[int]) -> None:
        body = {**greedy_body(ids, tokens, min_new_tokens=tokens), "bootstrap_host": HOST, "bootstrap_port": boot,
                "bootstrap_room": random.getrandbits(63)}
        t = threading.Thread(target=lambda: generate(prefill, body))
        t.start()
        first = last = None
        n = 0
        try:
            for chunk in sse_chunks(decode, body):
                now = time.monotonic()
                first = first if first is not None else now
                last, n = now, len(chunk.get("output_ids") or [])
        except Exception as e:  # reported below
            errors.append(e)
        t.join()
        firsts.append(first)
        lasts.append(last)
        counts.append(n)

    threads = [threading.Thread(target=one, args=(ids,)) for ids in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors or min(counts) != tokens:
        raise RuntimeError(f"batch failed: {errors[:1]} counts {counts}")
    return sum(c - 1 for c in counts) / (max(lasts) - min(firsts))


def run(args) -> dict:
    model = build_cached(".artifacts/models")
    pm = PromptMaker(model)
    boot = free_port()
    common = dict(model=model, host=HOST, bootstrap_port=boot, max_running_requests=max(8, args.batch),
                  env={"SGLANG_PDD_SECRET": secrets.token_hex(16)})  # MD's (its token channel; no relay here)
    decodes = ["plain", "main"] + (["plain-overlap", "main-overlap"] if args.with_overlap else [])
    with ServerGroup(args.log_dir) as g:
        p = g.start("prefill", ServerConfig(port=free_port(), nccl_port=free_port(), mode="prefill", **common))
        servers = {}
        for name in decodes:
            extra = ["--pdd-role", "main"] if name.startswith("main") else []
            servers[name] = g.start(name, ServerConfig(
                port=free_port(), nccl_port=free_port(), mode="decode", decode_radix_cache=True,
                overlap=name.endswith("overlap"), extra=extra + ["--pdd-idle-wait-ms", f"{IDLE_WAIT_MS:g}"],
                **common))
        for s in (p, *servers.values()):
            s.wait_ready()
        figures: dict[str, list[float]] = {name: [] for name in servers}
        warm = [pm.ids(args.prompt, seed=1)]
        for s in servers.values():
            batch_throughput(p.url, s.url, boot, warm, 8)
        for r in range(args.repeat):
            prompts = [pm.ids(args.prompt, seed=100 * r + i) for i in range(args.batch)]
            order = list(servers.items()) if r % 2 == 0 else list(servers.items())[::-1]
            for name, s in order:  # the same prompts, in the same order, on every server
                figures[name].append(batch_throughput(p.url, s.url, boot, prompts, args.tokens))
                print(f"repeat {r + 1}: {name} {figures[name][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    return {"batch": args.batch, "tokens": args.tokens, "prompt": args.prompt, "repeat": args.repeat,
            "tok_per_s": figures, "idle_wait_ms": IDLE_WAIT_MS,
            "main_over_plain": {name: [m / b for m, b in zip(xs, figures[baseline(name)])]
                                for name, xs in figures.items() if name.startswith("main")}}


def table(res: dict) -> str:
    lines = [f"decode throughput, batch {res['batch']} x {res['tokens']} tokens (prompts of {res['prompt']}), "
             f"{res['repeat']} repeats, idle wait {res.get('idle_wait_ms', IDLE_WAIT_MS):g} ms on every server, "
             "median (min-max):", "| decode server | tok/s | vs plain on the same loop, per repeat |", "|---|---|---|"]
    for name, xs in res["tok_per_s"].items():
        base = res["tok_per_s"][baseline(name)]
        ratios = " / ".join(f"{x / b:.3f}" for x, b in zip(xs, base))
        lines.append(f"| {name} | {statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f}) | {ratios} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.micro.decode_overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=200, help="prompt tokens per request")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--with-overlap", action="store_true", help="add plain and main decode on sglang's overlap scheduler")
    ap.add_argument("--log-dir", default=".artifacts/decode-overhead")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    res = run(args)
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
