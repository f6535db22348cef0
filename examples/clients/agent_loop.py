"""A multi-turn agent loop through the PDD router with the OpenAI Python SDK.

    pip install openai
    python agent_loop.py --base-url http://ROUTER:8000/v1 --model MODEL --turns 4

This is the traffic PDD is built for: every turn resends the whole conversation (system prompt, all
earlier turns, the assistant's replies) plus a little new text, the way an agent appends tool output.
So ~90 % of each prompt is already in MainDecode's radix cache, and the router sends most turns P->MD
(only the missed KV crosses the WAN). The router's `/metrics` shows the split
(`sglang_pdd_router_requests_total{pipeline=...}`).
"""

from __future__ import annotations

import argparse
import sys

from openai import OpenAI

SYSTEM = "You are a coding agent. Reply with the next command to run."


def tool_output(turn: int) -> str:
    """Stands in for running the agent's command: the new text each turn appends."""
    return f"$ step {turn}: exit 0, 3 files changed"


def agent_loop(client: OpenAI, model: str, task: str, turns: int, max_tokens: int = 64,
               out=sys.stdout) -> list[dict]:
    """Run `turns` turns; each request carries the whole conversation so far. Returns the conversation."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for turn in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                               temperature=0)
        text = reply.choices[0].message.content or ""
        out.write(f"[turn {turn}] prompt {reply.usage.prompt_tokens} tokens -> {text!r}\n")
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": tool_output(turn)})
    return messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--task", default="Fix the failing test in tests/test_io.py.")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key="unused")
    agent_loop(client, args.model, args.task, args.turns, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
