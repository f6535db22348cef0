"""One streamed `/generate` request, timed by the client: TTFT, TPOT, end-to-end, token counts.

Times are what a user in cluster A sees: from sending the request to the first chunk that carries
an output token (TTFT), to the end of the stream (end-to-end). TPOT is the mean gap between output
tokens after the first: (e2e - TTFT) / (output tokens - 1), as vLLM/sglang benchmarks define it.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from sglang_pdd.protocol.reply import ReplyMeta, ReplyMetaError

logger = logging.getLogger(__name__)


@dataclass
class StreamResult:
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    error: str = ""
    finish_reason: dict = field(default_factory=dict)  # meta_info.finish_reason of the last chunk
    pdd: ReplyMeta | None = None  # the PDD router's meta_info.pdd (pipeline, mode, MD hit, ...), None for other systems

    @property
    def pipeline(self) -> str:
        """The PDD router's choice, empty for other systems."""
        return (self.pdd.pipeline or "") if self.pdd else ""

    @property
    def handoff_tokens(self) -> int | None:
        """Eager tokens RLD handed over (None: no handoff)."""
        return self.pdd.handoff_tokens if self.pdd else None

    @property
    def tpot_s(self) -> float | None:
        return tpot(self.ttft_s, self.e2e_s, self.output_tokens)


def tpot(ttft_s: float | None, e2e_s: float | None, output_tokens: int) -> float | None:
    """Mean time per output token after the first; 0 for a single-token output, None if unknown."""
    if ttft_s is None or e2e_s is None or output_tokens < 1:
        return None
    if output_tokens == 1:
        return 0.0
    return max(e2e_s - ttft_s, 0.0) / (output_tokens - 1)


def greedy_request(input_ids: list[int], max_new_tokens: int) -> dict:
    return {"input_ids": list(input_ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


def parse_sse_line(raw: bytes) -> dict | None:
    """A `data: {...}` line of sglang's stream as a dict; None for keep-alives and `[DONE]`."""
    line = raw.decode(errors="replace").strip()
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]" or not payload:
        return None
    return json.loads(payload)


def merge_output_ids(acc: list[int], chunk_ids: list[int]) -> list[int]:
    """sglang streams cumulative `output_ids` by default, deltas with incremental streaming."""
    if len(chunk_ids) >= len(acc) and chunk_ids[: len(acc)] == acc:
        return chunk_ids
    return acc + chunk_ids


def stream(url: str, body: dict, timeout_s: float = 300.0, headers: dict | None = None) -> StreamResult:
    """POST `body` to `url`/generate with streaming on; never raises for a failed request.
    `headers` are added to the request (e.g. an API key's Authorization)."""
    req = urllib.request.Request(url.rstrip("/") + "/generate",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    t0 = time.monotonic()
    ttft, last, ids = None, None, []
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                chunk = parse_sse_line(raw)
                if chunk is None:
                    continue
                if "error" in chunk:
                    return StreamResult(False, error=str(chunk["error"]))
                if ttft is None and (chunk.get("output_ids") or chunk.get("text")):
                    ttft = time.monotonic() - t0
                ids = merge_output_ids(ids, list(chunk.get("output_ids") or []))
                last = chunk
    except (OSError, urllib.error.URLError, ValueError) as e:
        return StreamResult(False, error=f"{type(e).__name__}: {e}")
    e2e = time.monotonic() - t0
    if last is None:
        return StreamResult(False, error="empty stream")
    meta = last.get("meta_info") or {}
    try:
        pdd = ReplyMeta.of(meta)
    except ReplyMetaError as e:
        return StreamResult(False, error=str(e))
    return StreamResult(True, ttft_s=ttft if ttft is not None else e2e, e2e_s=e2e,
                        prompt_tokens=int(meta.get("prompt_tokens", 0)),
                        output_tokens=int(meta.get("completion_tokens", len(ids))),
                        cached_tokens=int(meta.get("cached_tokens", 0)), output_ids=ids,
                        finish_reason=dict(meta.get("finish_reason") or {}), pdd=pdd)
