"""How many requests the router serves at once: in all (`--max-in-flight`; over it 503) and per client
(`--max-in-flight-per-client`; over it 429), both with Retry-After. A client is its API key when the
router has keys (`router.api.client_auth`), else its peer address. The probes (`/live`, `/ready`, `/health`)
and `/metrics` are not counted (`client_auth.OPEN_PATHS`: probes and scrapes must get through a full
router). A request counts from its head to its response's end, its body read and tokenization
included.
"""

from __future__ import annotations

from collections import defaultdict

from aiohttp import web

from sglang_pdd.router.api.client_auth import CLIENT, OPEN_PATHS


class InFlight:
    def __init__(self, max_total: int, max_per_client: int, retry_after_s: int, metrics):
        self.max_total, self.max_per_client, self.retry_after_s = max_total, max_per_client, retry_after_s
        self.metrics = metrics
        self.total = 0
        self.per_client: dict[str, int] = defaultdict(int)

    def _refuse(self, status: int, reason: str, message: str) -> web.Response:
        self.metrics.refused.labels(reason).inc()
        return web.json_response({"error": {"message": message, "code": status}}, status=status,
                                 headers={"Retry-After": str(self.retry_after_s)})

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        client = request.get(CLIENT) or f"addr:{request.remote}"
        if self.total >= self.max_total:
            return self._refuse(503, "in-flight", f"the router is serving its limit of {self.max_total} requests "
                                                  "(--max-in-flight); retry later")
        if self.per_client[client] >= self.max_per_client:
            return self._refuse(429, "per-client", f"this client has {self.max_per_client} requests in flight, "
                                                   "the router's limit per client (--max-in-flight-per-client)")
        self.total += 1
        self.per_client[client] += 1
        try:
            return await handler(request)
        finally:
            self.total -= 1
            self.per_client[client] -= 1
            if not self.per_client[client]:
                del self.per_client[client]
