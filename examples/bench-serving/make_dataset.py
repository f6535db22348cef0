"""Write the offline ShareGPT-format dataset for `python -m sglang.bench_serving`.

    python examples/bench-serving/make_dataset.py [OUT]   (default: sharegpt-offline.json next to it)

bench_serving's `random` dataset takes its prompt text from a ShareGPT file and downloads one unless
`--dataset-path` names a valid local JSON; its `sharegpt` dataset reads the same format. This file is
that format (a list of `{"conversations": [{"from": "human", ...}, {"from": "gpt", ...}]}`), built
from a fixed seed: agent-style turns (a task, code, a tool's output) and a reply. `random` repeats or
cuts each prompt to `--random-input-len` tokens and serves at most one request per conversation.
"""

from __future__ import annotations

import json
import os
import random
import sys

CONVERSATIONS = 128
TASKS = ["fix the failing test in", "add type hints to", "explain the error raised by", "speed up",
         "write a docstring for", "review the change to", "port to asyncio", "add logging to"]
WORDS = ["request", "token", "cache", "prefix", "stream", "router", "decode", "prefill", "page", "batch",
         "session", "handoff", "budget", "window", "latency", "bytes", "queue", "worker", "config", "shard"]


def _code(rng: random.Random) -> str:
    a, b, c = rng.sample(WORDS, 3)
    return f"def {a}_{b}({c}, n):\n    return [{c}[i] for i in range(n) if i % {rng.randint(2, 9)}]\n"


def conversation(rng: random.Random) -> dict:
    task = f"Please {rng.choice(TASKS)} `{rng.choice(WORDS)}_{rng.choice(WORDS)}.py`."
    tool = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
    human = f"{task}\n\n```python\n{_code(rng)}```\n\nTool output:\n{tool}\n"
    gpt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40))) + "."
    return {"conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


def dataset(seed: int = 0, n: int = CONVERSATIONS) -> list[dict]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]


def render(rows: list[dict]) -> str:
    """One conversation a line (readable diffs)."""
    return "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"


def main(argv: list[str]) -> int:
    out = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharegpt-offline.json")
    with open(out, "w") as f:
        f.write(render(dataset()))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
