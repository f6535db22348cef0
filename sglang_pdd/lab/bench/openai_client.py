"""One streamed OpenAI `/v1/completions` request with a token-id prompt, timed like `client.stream`.

The benchmark's greedy `/generate` body becomes `{"prompt": input_ids, "max_tokens", "temperature": 0,
"ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}, "return_token_ids": true}`.
TTFT is the first chunk that carries a choice (a server sends it with the first output token); the
output token count is the final usage chunk's `completion_tokens` (else the token ids streamed,
else the chunks). `return_token_ids` is sglang's extension: with it the later turns of a session
resend the real output ids; a server that ignores it (the PDD router) leaves them to the
workload's stand-in tokens, which only lowers those turns' prefix hit beyond the earlier output.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from sglang_pdd.lab.bench.client import StreamResult, parse_sse_line


def completion_body(body: dict, model: str) -> dict:
    """The OpenAI form of a `client.greedy_request` body."""
    sp = body.get("sampling_params") or {}
    return {"model": model, "prompt": list(body["input_ids"]), "max_tokens": int(sp.get("max_new_tokens", 16)),
            "temperature": float(sp.get("temperature", 0.0)), "ignore_eos": bool(sp.get("ignore_eos", True)),
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}


def stream_completion(url: str, body: dict, timeout_s: float = 300.0, headers: dict | None = None,
                      model: str = "default") -> StreamResult:
    """POST the OpenAI form of `body` to `url`/v1/completions; never raises for a failed request."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions",
                                 data=json.dumps(completion_body(body, model)).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    t0 = time.monotonic()
    ttft, ids, chunks, usage, reason = None, [], 0, None, None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                chunk = parse_sse_line(raw)
                if chunk is None:
                    continue
                if "error" in chunk:
                    err = chunk["error"]
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    return StreamResult(False, error=str(msg))
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    chunks += 1
                    ids += list(choice.get("token_ids") or [])
                    reason = choice.get("finish_reason") or reason
    except (OSError, urllib.error.URLError, ValueError) as e:
        return StreamResult(False, error=f"{type(e).__name__}: {e}")
    e2e = time.monotonic() - t0
    if ttft is None:
        return StreamResult(False, error="empty stream (no choice)")
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return StreamResult(True, ttft_s=ttft, e2e_s=e2e, prompt_tokens=int(usage.get("prompt_tokens") or len(body["input_ids"])),
                        output_tokens=int(usage.get("completion_tokens") or len(ids) or chunks),
                        cached_tokens=int(details.get("cached_tokens") or 0), output_ids=ids,
                        finish_reason={"type": reason} if reason else {})
