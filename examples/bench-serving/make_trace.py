"""Write a small prefix-heavy trace in the Mooncake format for `python -m sglang.bench_serving
--dataset-name mooncake`.

    python examples/bench-serving/make_trace.py [OUT]   (default: mooncake-agentic.jsonl next to it)

The Mooncake trace format (kvcache-ai/Mooncake, FAST25-release/traces/, Apache-2.0) is one JSON object a
line: `timestamp` (ms from the start), `input_length`, `output_length` and `hash_ids`, the prompt's
512-token blocks in order, equal ids being the same block: two requests share a cacheable prefix for as
many leading ids as they share. bench_serving builds each prompt from the ids (a short run of text per
id, so equal leading ids give equal leading text) and replays the trace at its timestamps
(`--mooncake-slowdown-factor` stretches or compresses them). Unlike `--dataset-name random`, which never
sends a prefix twice, this is what PDD is for: each session's turn resends the previous turn's context
plus a little more, so MD's radix cache holds most of it and only the new blocks cross the WAN.

Built from a fixed seed: SESSIONS agent sessions, each TURNS turns; every session starts with the same
SYSTEM blocks (tool definitions), adds 1-3 blocks of its own per turn, and sessions start STAGGER_MS
apart with a turn every TURN_GAP_MS (plus jitter), so the first records already interleave turns of
several sessions.
"""

from __future__ import annotations

import json
import os
import random
import sys

SESSIONS, TURNS, SYSTEM = 8, 6, 2
STAGGER_MS, TURN_GAP_MS = 1000, 1500
BLOCK = 512  # tokens per hash id (the format's block size)


def trace(seed: int = 0, sessions: int = SESSIONS, turns: int = TURNS) -> list[dict]:
    rng = random.Random(seed)
    next_id = SYSTEM  # ids 0..SYSTEM-1: the system blocks every session shares
    rows = []
    for s in range(sessions):
        context = list(range(SYSTEM))
        t = s * STAGGER_MS
        for _ in range(turns):
            new = rng.randint(1, 3)
            context = context + list(range(next_id, next_id + new))
            next_id += new
            rows.append({"timestamp": t, "input_length": BLOCK * len(context),
                         "output_length": rng.choice((16, 32, 64, 128)), "hash_ids": list(context)})
            t += TURN_GAP_MS + rng.randint(0, 500)
    rows.sort(key=lambda r: r["timestamp"])  # stable: equal timestamps keep the session order
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str]) -> int:
    out = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "mooncake-agentic.jsonl")
    with open(out, "w") as f:
        f.write(render(trace()))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
