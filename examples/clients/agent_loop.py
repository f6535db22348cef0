"""A multi-turn tool-using agent loop through the PDD router with the OpenAI Python SDK.

    pip install openai
    python agent_loop.py --base-url http://ROUTER:8000/v1 --model MODEL --turns 4 [--tool-choice required]

This is the traffic PDD is built for: every turn resends the whole conversation (system prompt, tool
definitions, all earlier turns, the assistant's tool calls and the tools' output) plus a little new
text. So most of each prompt is already in MainDecode's radix cache: the router sends most turns P->MD
(only the missed KV crosses the WAN) and reports the held prefix as
`usage.prompt_tokens_details.cached_tokens`. The model's tool calls come back as `tool_calls` when the
router runs with sglang's tool-call parser for the model (`--tool-call-parser`, as sglang's server);
the loop runs each call here (stand-in tools) and sends the result back as a `tool` message.
"""

from __future__ import annotations

import argparse
import json
import sys

from openai import OpenAI

SYSTEM = "You are a coding agent. Use the tools to inspect the repository and fix the failing test."
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite, or the tests matching a pattern",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": []}}},
]


def parsed_arguments(arguments: str) -> dict | None:
    """A call's arguments as a JSON object, or None (not JSON, or not an object: a model's bad call)."""
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def run_tool(name: str, arguments: str, turn: int) -> str:
    """Stands in for running the agent's tool: the new text each turn appends."""
    args = parsed_arguments(arguments)
    if args is None:
        return f"error: the arguments of {name} are not a JSON object"
    shown = json.dumps(args, sort_keys=True)[:80]
    return f"$ {name} {shown}: step {turn}, exit 0, 3 files changed"


def go_on(turn: int) -> str:
    """The user's next message after a turn without tool calls."""
    return f"Go on (step {turn} done)."


def agent_loop(client: OpenAI, model: str, task: str, turns: int, max_tokens: int = 64, tool_choice="auto",
               extra_body: dict | None = None, tools: list[dict] | None = TOOLS, out=sys.stdout) -> list[dict]:
    """Run `turns` turns; each request carries the whole conversation so far. Returns the conversation
    (the assistant's tool calls as the API returned them, ids included). `tools` None: plain chat."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    with_tools = {"tools": tools, "tool_choice": tool_choice} if tools else {}
    for turn in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                               extra_body=extra_body, **with_tools)
        msg = reply.choices[0].message
        calls = msg.tool_calls or []
        details = reply.usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        out.write(f"[turn {turn}] prompt {reply.usage.prompt_tokens} tokens ({cached} cached) -> "
                  f"{[c.function.name for c in calls] or repr(msg.content)}\n")
        said = {"role": "assistant", "content": msg.content or ""}
        if calls:
            # a bad call is sent back with empty arguments (servers refuse history whose arguments are not
            # a JSON object) and its result says what was wrong
            said["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name,
                "arguments": c.function.arguments if parsed_arguments(c.function.arguments) is not None else "{}"}}
                for c in calls]
        messages.append(said)
        for c in calls:  # one result per call
            messages.append({"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name,
                                                                                      c.function.arguments, turn)})
        if not calls:
            messages.append({"role": "user", "content": go_on(turn)})
    return messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="unused", help="the router's --api-key, if it has one")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tool-choice", default="auto", choices=("auto", "required", "none"))
    ap.add_argument("--task", default="Fix the failing test in tests/test_io.py.")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    agent_loop(client, args.model, args.task, args.turns, args.max_tokens, args.tool_choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
