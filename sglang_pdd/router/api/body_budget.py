"""The bytes of request bodies the router holds at once, across every client (`--max-body-mb-in-flight`).

`--max-body-mb` bounds one body and `--max-in-flight` the requests, but not their product: 1,024
requests of 64 MB each are 64 GB. Here every body's bytes are taken from one budget as they arrive
(`read_body`), and given back when the request's response ends (`middleware`), its parsed prompt
having lived that long. A body that does not fit what is left is answered 503 with Retry-After at
once (the rest of it is read and dropped, not held) (`refused{reason="body-budget"}`), so a few clients sending huge
bodies cannot hold the router's memory, nor starve the small requests beside them of it.
"""

from __future__ import annotations

from aiohttp import web

LEASE = "pdd_body_lease"  # the request's key: the bytes its body took from the budget


class BodyBudget:
    def __init__(self, total_bytes: int, retry_after_s: int, metrics):
        if total_bytes < 1:
            raise ValueError(f"--max-body-mb-in-flight must be positive, got {total_bytes} bytes")
        self.total, self.retry_after_s, self.metrics = total_bytes, retry_after_s, metrics
        self.held = 0

    def take(self, request: web.Request, n: int) -> bool:
        """Take `n` more bytes for `request`'s body; False (nothing taken) when they do not fit."""
        if self.held + n > self.total:
            return False
        self.held += n
        request[LEASE] = request.get(LEASE, 0) + n
        return True

    def refusal(self) -> web.Response:
        self.metrics.refused.labels("body-budget").inc()
        message = (f"the router holds its limit of {self.total} bytes of request bodies "
                   "(--max-body-mb-in-flight); retry later")
        return web.json_response({"error": {"message": message, "code": 503}}, status=503,
                                 headers={"Retry-After": str(self.retry_after_s)})

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        try:
            return await handler(request)
        finally:
            self.held -= request.get(LEASE, 0)
            request[LEASE] = 0
