"""Talking to one sglang server's native API from the router (aiohttp): streamed /generate, abort."""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

import aiohttp

logger = logging.getLogger(__name__)


class UpstreamError(RuntimeError):
    def __init__(self, role: str, url: str, status: int | None, message: str):
        super().__init__(f"{role} {url}: {f'HTTP {status}: ' if status else ''}{message}")
        self.role, self.url, self.status = role, url, status


async def stream_generate(session: aiohttp.ClientSession, role: str, url: str, body: dict,
                          timeout_s: float) -> AsyncIterator[dict]:
    """Yield sglang's streamed chunks (cumulative output_ids and meta_info) until the last one."""
    t = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(10.0, timeout_s))
    try:
        async with session.post(url + "/generate", json={**body, "stream": True}, timeout=t) as r:
            if r.status != 200:
                raise UpstreamError(role, url, r.status, (await r.text())[:500])
            async for raw in r.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise UpstreamError(role, url, None, str(chunk["error"])[:500])
                yield chunk
                reason = (chunk.get("meta_info") or {}).get("finish_reason")
                if reason is not None:
                    if reason.get("type") == "abort":
                        raise UpstreamError(role, url, reason.get("status_code"), reason.get("message", "aborted"))
                    return
    except aiohttp.ClientError as e:
        raise UpstreamError(role, url, None, f"{type(e).__name__}: {e}") from None
    except TimeoutError:
        raise UpstreamError(role, url, None, f"no answer within {timeout_s:g}s") from None


async def post_json(session: aiohttp.ClientSession, role: str, url: str, path: str, body: dict,
                    timeout_s: float) -> dict:
    try:
        async with session.post(url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
            if r.status != 200:
                raise UpstreamError(role, url, r.status, text[:500])
            return json.loads(text) if text else {}
    except aiohttp.ClientError as e:
        raise UpstreamError(role, url, None, f"{type(e).__name__}: {e}") from None
    except TimeoutError:
        raise UpstreamError(role, url, None, f"no answer within {timeout_s:g}s") from None


async def abort(session: aiohttp.ClientSession, url: str, rid: str) -> None:
    """Best effort: sglang's /abort_request for one request id (never raises)."""
    try:
        async with session.post(url + "/abort_request", json={"rid": rid},
                                timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()
    except Exception as e:  # the peer may be gone already; that is what we are cleaning up after
        logger.debug("abort %s on %s: %s", rid, url, e)
