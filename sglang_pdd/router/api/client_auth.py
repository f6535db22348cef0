"""Client authentication at the router: OpenAI-style `Authorization: Bearer KEY`.

With one or more API keys configured (`--api-key`, or `SGLANG_PDD_ROUTER_API_KEY`), every request but
the probes (`/live`, `/ready`, `/health`) and `/metrics` (Kubernetes, Prometheus) must carry one of
them; otherwise it is answered 401 with an OpenAI-shaped error (`refused{reason="auth"}`). Keys are
compared as SHA-256 digests with `hmac.compare_digest`, against every key (the time taken says nothing
of which key, or how much of it, matched). A request's client, for the per-client in-flight cap (`router.api.in_flight`), is then the key it
presented (as its index, never the key), else the peer address.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Sequence

from aiohttp import web

ENV_API_KEY = "SGLANG_PDD_ROUTER_API_KEY"  # one key, or several separated by commas
OPEN_PATHS = frozenset({"/live", "/ready", "/health", "/metrics"})  # probes and scrapes
CLIENT = "pdd_client"  # the request's client key (request[CLIENT]), for the per-client cap


def keys_from(flag_keys: Sequence[str] | None, environ=os.environ) -> list[str]:
    """The router's API keys: --api-key when given (it wins), else the environment's; [] for none.
    Raises ValueError for an empty key."""
    if flag_keys:
        keys = list(flag_keys)
    else:
        env = environ.get(ENV_API_KEY, "")
        keys = [k.strip() for k in env.split(",")] if env.strip() else []
    if any(not k for k in keys):
        raise ValueError(f"--api-key / {ENV_API_KEY}: an API key must not be empty")
    return keys


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ClientAuth:
    def __init__(self, keys: Sequence[str], metrics):
        self._digests = [_digest(k.encode()) for k in keys]
        self.metrics = metrics

    @property
    def on(self) -> bool:
        return bool(self._digests)

    def key_index(self, header: str | None) -> int | None:
        """Which configured key `Authorization: Bearer KEY` carries, or None."""
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return None
        d = _digest(given.strip().encode("utf-8", "surrogatepass"))
        match = None
        for i, mine in enumerate(self._digests):  # no early exit
            if hmac.compare_digest(d, mine):
                match = i
        return match

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        if not self.on:
            request[CLIENT] = f"addr:{request.remote}"
            return await handler(request)
        header = request.headers.get("Authorization")
        i = self.key_index(header)
        if i is None:
            self.metrics.refused.labels("auth").inc()
            why = "no API key: send Authorization: Bearer KEY" if header is None else "invalid API key"
            return web.json_response(
                {"error": {"message": why, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}},
                status=401, headers={"WWW-Authenticate": "Bearer"})
        request[CLIENT] = f"key:{i}"
        return await handler(request)
