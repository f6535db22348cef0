"""Streaming chat through the PDD router with the OpenAI Python SDK.

    pip install openai
    python stream_chat.py --base-url http://ROUTER:8000/v1 --model MODEL "Why split prefill and decode?"

The router speaks the OpenAI API (`/v1/chat/completions`, streaming or not). Whether the request goes
P->MD or P->RLD->MD, the client sees one stream: RelayDecode's first tokens, then MainDecode's.
`--model` is the router's `--model-name` (default: its `--tokenizer` path); `GET /v1/models` lists it.
"""

from __future__ import annotations

import argparse
import sys

from openai import OpenAI


def stream_chat(client: OpenAI, model: str, messages: list[dict], max_tokens: int = 128, out=sys.stdout) -> str:
    """Send one chat request with stream=True, print each delta as it arrives; return the whole reply."""
    parts = []
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    for event in stream:
        if not event.choices:
            continue
        delta = event.choices[0].delta.content or ""
        parts.append(delta)
        out.write(delta)
        out.flush()
    out.write("\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("prompt")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key="unused")  # the router checks no key
    stream_chat(client, args.model, [{"role": "user", "content": args.prompt}], args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
