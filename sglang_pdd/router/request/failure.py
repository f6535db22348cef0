"""How one request fails: `RequestFailed` is what its client hears (a status and a message that names
no server); `RoleFailure` is a role's failure as the dispatcher's drain met it, which may migrate."""

from __future__ import annotations

from sglang_pdd.router.peers import upstream


class RequestFailed(RuntimeError):
    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


class RoleFailure(Exception):
    """A role's failure as the drain met it: `failed` is what the client hears unless it migrates;
    `cause` is None when it may not migrate (`migration.rules.cause_of`). `silent`: an idle deadline while
    the peer answered no request at all (only then is it the peer's failure: `idle_deadline`)."""

    def __init__(self, role: str, cause: str | None, failed: RequestFailed, silent: bool = True):
        super().__init__(str(failed))
        self.role, self.cause, self.failed, self.silent = role, cause, failed, silent


def failure_of(e: Exception) -> RequestFailed:
    """What the client hears of a role's failure: its 4xx as is, anything else 502; never a URL."""
    if isinstance(e, upstream.UpstreamError):
        if e.status in (401, 403):  # a role refused the router's own key: the deployment's fault, not the client's
            return RequestFailed(f"{e.role}: refused the router's key (HTTP {e.status}): the router's role key "
                                 "and the roles' --api-key differ", status=502)
        status = e.status if e.status is not None and 400 <= e.status < 500 else 502
        return RequestFailed(e.public, status=status)
    return RequestFailed(f"internal error talking to an upstream server ({type(e).__name__})", status=502)


def timed_out(request_timeout_s: float) -> RequestFailed:
    """The request ran past its total deadline: the client's limit, not a role's failure."""
    return RequestFailed(f"the request ran past the router's --request-timeout of {request_timeout_s:g}s", status=504)
