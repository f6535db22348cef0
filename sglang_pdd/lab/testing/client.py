"""A minimal client for sglang's native `/generate`: greedy requests, and PD requests by hand."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request

from sglang_pdd.lab.testing.servers import http_json

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang's marker: decode synthesizes the KV instead of receiving it


class GenerateError(RuntimeError):
    pass


def greedy_body(input_ids: list[int], max_new_tokens: int, **sampling) -> dict:
    return {
        "input_ids": list(input_ids),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling},
    }


def generate(url: str, body: dict, timeout: float = 300.0) -> dict:
    status, out = http_json(url.rstrip("/") + "/generate", body, timeout=timeout)
    if status != 200 or not isinstance(out, dict):
        raise GenerateError(f"{url}: HTTP {status}: {out}")
    return out


def greedy_ids(url: str, input_ids: list[int], max_new_tokens: int, **sampling) -> list[int]:
    return generate(url, greedy_body(input_ids, max_new_tokens, **sampling))["output_ids"]


def pd_generate(prefill_url: str, decode_url: str, bootstrap_host: str, bootstrap_port: int, body: dict,
                room: int | None = None) -> dict:
    """What upstream PD routers do: the same body, with bootstrap fields, to prefill and decode at once."""
    body = {**body, "bootstrap_host": bootstrap_host, "bootstrap_port": bootstrap_port,
            "bootstrap_room": room if room is not None else random.getrandbits(63)}
    results: dict[str, object] = {}

    def call(name: str, url: str) -> None:
        try:
            results[name] = generate(url, body)
        except Exception as e:  # reported below
            results[name] = e

    t = threading.Thread(target=call, args=("prefill", prefill_url))
    t.start()
    call("decode", decode_url)
    t.join()
    for name in ("decode", "prefill"):
        if isinstance(results[name], Exception):
            raise GenerateError(f"{name}: {results[name]}")
    return results["decode"]


def fake_transfer_generate(decode_url: str, body: dict) -> dict:
    """Send to a PD decode server only, telling it the KV comes from nowhere (negative control)."""
    body = {**body, "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_port": 1,
            "bootstrap_room": random.getrandbits(63)}
    return generate(decode_url, body)


def sse_chunks(url: str, body: dict, timeout: float = 300.0):
    """Streamed `/generate`: each SSE chunk as it comes (error chunks too); closing the generator
    closes the connection."""
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield json.loads(line[5:])


def stream_generate(url: str, body: dict, timeout: float = 300.0) -> dict:
    """Streamed `/generate`; returns the final chunk plus `ttft_s` and `e2e_s` seen by the client."""
    t0 = time.monotonic()
    ttft, last = None, None
    for chunk in sse_chunks(url, body, timeout):
        if "error" in chunk:
            raise GenerateError(f"{url}: {chunk['error']}")
        if ttft is None and chunk.get("output_ids"):
            ttft = time.monotonic() - t0
        last = chunk
    if last is None:
        raise GenerateError(f"{url}: empty stream")
    return {**last, "ttft_s": ttft, "e2e_s": time.monotonic() - t0}
