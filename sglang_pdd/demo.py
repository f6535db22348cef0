"""The demo: prefill + decode (decode radix cache) + router on the tiny model, on this box.

    python -m sglang_pdd.demo [--turns 3] [--first-tokens 1500] [--new-tokens 32]

Starts the servers inside a private network namespace (needs root), runs one multi-turn
conversation through the upstream PD router (each turn resends the whole history plus new text,
as agents do), and prints per turn: prompt, output, TTFT, and the KV bytes prefill actually moved to
decode (from the transfer layer). Later issues grow this into the two-datacenter PDD demo.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from sglang_pdd import __version__
from sglang_pdd.metrics import parse_exposition
from sglang_pdd.netns import NetNS, netns_supported
from sglang_pdd.testing.client import greedy_body, stream_generate
from sglang_pdd.testing.launch_args import RouterConfig, ServerConfig
from sglang_pdd.testing.prompts import PromptMaker
from sglang_pdd.testing.servers import ServerGroup, http_json
from sglang_pdd.testing.tiny_model import TinyModelSpec, build_cached


def kv_bytes_sent(prefill_url: str) -> int:
    _, text = http_json(prefill_url + "/metrics")
    samples = parse_exposition(text, "sglang_pdd_transfer_bytes_total")
    return int(sum(v for labels, v in samples.items() if dict(labels).get("kind") == "kv"))


def short(text: str, n: int = 38) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def run(args) -> int:
    ok, why = netns_supported()
    if not ok:
        print(f"demo: {why} (servers run in a private network namespace)", file=sys.stderr)
        return 2
    root = args.artifacts
    t0 = time.monotonic()
    model = build_cached(os.path.join(root, "models"), TinyModelSpec())
    spec = TinyModelSpec()
    print(f"sglang-pdd {__version__} demo — tiny Llama ({spec.layers} layers, "
          f"{spec.kv_bytes_per_token // 1024} KiB KV/token), model ready in {time.monotonic() - t0:.1f}s")
    maker = PromptMaker(model)
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    log_dir = tempfile.mkdtemp(prefix="demo-", dir=os.path.join(root, "logs"))
    ns = NetNS(f"pdd-demo-{os.getpid()}").create()
    ns.enter()
    rows = []
    try:
        with ServerGroup(log_dir) as group:
            t0 = time.monotonic()
            p = group.start("prefill", ServerConfig(model=model, port=30100, nccl_port=31100, mode="prefill",
                                                    extra=["--pdd-role", "prefill"]))
            d = group.start("decode", ServerConfig(model=model, port=30200, nccl_port=31200, mode="decode",
                                                   decode_radix_cache=True, extra=["--pdd-role", "main"]))
            p.wait_ready()
            d.wait_ready()
            r = group.start("router", RouterConfig(prefill=[(p.url, 8998)], decode=[d.url], port=30300)).wait_ready()
            print(f"servers up in {time.monotonic() - t0:.1f}s (logs: {log_dir})\n")
            history = maker.ids(args.first_tokens, seed=1)
            for turn in range(1, args.turns + 1):
                before = kv_bytes_sent(p.url)
                out = stream_generate(r.url, greedy_body(history, args.new_tokens))
                moved = kv_bytes_sent(p.url) - before
                rows.append((turn, len(history), short(maker.text(history[-60:])), short(repr(out["text"])[1:-1]),
                             out["ttft_s"], out["e2e_s"], moved))
                history = history + out["output_ids"] + maker.ids(args.append_tokens, seed=turn + 1)
    finally:
        ns.delete()
    print(f"{'turn':>4} {'prompt tok':>10}  {'prompt (tail)':<38}  {'output':<38} {'TTFT':>7} {'total':>7} {'KV moved':>10}")
    for turn, n, ptxt, otxt, ttft, e2e, moved in rows:
        print(f"{turn:>4} {n:>10}  {ptxt:<38}  {otxt:<38} {ttft:>6.2f}s {e2e:>6.2f}s {moved / 2**20:>7.2f} MiB")
    print("\nTurn 1 moves the whole prompt's KV; later turns move only what decode's radix cache lacks.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--first-tokens", type=int, default=1500)
    ap.add_argument("--append-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--artifacts", default=os.environ.get("SGLANG_PDD_ARTIFACTS", ".artifacts"))
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
