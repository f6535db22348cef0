"""Talking to one sglang server's native API from the router (aiohttp): streamed /generate, abort.

sglang streams cumulative `output_ids` (and logprobs) unless started with
`--incremental-streaming-output` (`router.request.output_view` reads both): one SSE line grows with the
output, past aiohttp's line limit (`readline` raises `LineTooLong`) for long outputs with logprobs.
Lines are cut here from raw chunks instead, bounded only by `MAX_LINE` (far beyond any real output).

An `UpstreamError` keeps two messages: `str(e)` names the server's URL (for the router's log) and
`public` does not (for the client); `status` is the upstream's HTTP status or the `code` sglang
reported inside a 200 stream (None when the server could not be reached or broke the stream);
`kind` says how it failed (http, error, abort, unreachable, broken, timeout; see `router.request.migration.rules`).
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

import aiohttp
import msgspec

logger = logging.getLogger(__name__)

_json = msgspec.json.Decoder()  # several times faster than json.loads on long cumulative lines
MAX_LINE = 1 << 30
_JSON = {"Content-Type": "application/json"}


def _body(body: dict) -> bytes:
    return msgspec.json.encode(body)  # a long prompt's IDs: several times faster than json.dumps  # one SSE line; a 16k-token chunk with logprobs is about 1 MiB


class UpstreamError(RuntimeError):
    def __init__(self, role: str, url: str, status: int | None, message: str, public: str | None = None,
                 kind: str = "http"):
        super().__init__(f"{role} {url}: {f'HTTP {status}: ' if status else ''}{message}")
        self.role, self.url, self.status, self.kind = role, url, status, kind
        self.public = public or f"{role}: {f'HTTP {status}: ' if status else ''}{message}".replace(url, f"<{role}>")


def _unreachable(role: str, url: str, e: Exception) -> UpstreamError:
    """aiohttp's message names the host and port: only the log gets it."""
    return UpstreamError(role, url, None, f"{type(e).__name__}: {e}",
                         public=f"{role}: the server failed or could not be reached ({type(e).__name__})",
                         kind="unreachable")


def _error_message(text: str) -> str:
    """sglang's error body is {"error": {"message": ...}} (or {"object": "error", "message": ...})."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    msg = err.get("message") if isinstance(err, dict) else err
    return str(msg if msg is not None else body)[:500]


def _stream_error(role: str, url: str, err) -> UpstreamError:
    """An error sglang reported inside a 200 stream: its `code` (400 for a bad request) is kept."""
    code = err.get("code") if isinstance(err, dict) else None
    msg = err.get("message", err) if isinstance(err, dict) else err
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    return UpstreamError(role, url, status, str(msg)[:500], kind="error")


async def sse_lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The stream's lines, cut from raw chunks (no line limit short of MAX_LINE)."""
    buf = bytearray()
    async for chunk in content.iter_any():
        buf += chunk
        if b"\n" not in chunk:
            if len(buf) > MAX_LINE:
                raise ValueError(f"a stream line over {MAX_LINE} bytes")
            continue
        lines = bytes(buf).split(b"\n")
        del buf[:]
        buf += lines.pop()
        for line in lines:
            yield line
    if buf:
        yield bytes(buf)


async def stream_generate(session: aiohttp.ClientSession, role: str, url: str, body: dict,
                          timeout_s: float) -> AsyncIterator[dict]:
    """Yield sglang's streamed chunks (cumulative output_ids and meta_info) until the one with a finish
    reason; a stream that ends without one is an error."""
    t = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(10.0, timeout_s))
    try:
        async with session.post(url + "/generate", data=_body({**body, "stream": True}), headers=_JSON, timeout=t) as r:
            if r.status != 200:
                raise UpstreamError(role, url, r.status, _error_message(await r.text()))
            async for raw in sse_lines(r.content):
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunk = _json.decode(data)
                except (msgspec.DecodeError, ValueError):
                    raise UpstreamError(role, url, None, "sent a stream chunk that is not JSON", kind="broken") from None
                if not isinstance(chunk, dict):
                    raise UpstreamError(role, url, None, "sent a stream chunk that is not an object", kind="broken")
                if "error" in chunk:
                    raise _stream_error(role, url, chunk["error"])
                reason = (chunk.get("meta_info") or {}).get("finish_reason")
                if isinstance(reason, dict) and reason.get("type") == "abort":
                    raise UpstreamError(role, url, reason.get("status_code"), reason.get("message", "aborted"),
                                        kind="abort")
                yield chunk
                if reason is not None:
                    return
            raise UpstreamError(role, url, None, "the stream ended without a finish reason", kind="broken")
    except aiohttp.ClientError as e:
        raise _unreachable(role, url, e) from None
    except TimeoutError:
        raise UpstreamError(role, url, None, f"no answer within {timeout_s:g}s", kind="timeout") from None


async def post_json(session: aiohttp.ClientSession, role: str, url: str, path: str, body: dict,
                    timeout_s: float) -> dict:
    """One non-streamed call; a reply whose finish reason is an abort is an error too."""
    try:
        async with session.post(url + path, data=_body(body), headers=_JSON,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
            if r.status != 200:
                raise UpstreamError(role, url, r.status, _error_message(text))
            out = json.loads(text) if text else {}
    except aiohttp.ClientError as e:
        raise _unreachable(role, url, e) from None
    except TimeoutError:
        raise UpstreamError(role, url, None, f"no answer within {timeout_s:g}s", kind="timeout") from None
    except ValueError:
        raise UpstreamError(role, url, None, "answered with a body that is not JSON", kind="broken") from None
    reason = (out.get("meta_info") or {}).get("finish_reason") if isinstance(out, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise UpstreamError(role, url, reason.get("status_code"), reason.get("message", "aborted"),
                                        kind="abort")
    return out


async def abort(session: aiohttp.ClientSession, url: str, rid: str) -> None:
    """Best effort: sglang's /abort_request for one request id (never raises)."""
    try:
        async with session.post(url + "/abort_request", json={"rid": rid},
                                timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()
    except Exception as e:  # the peer may be gone already; that is what we are cleaning up after
        logger.debug("abort %s on %s: %s", rid, url, e)
