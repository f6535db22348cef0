"""Request migration: when a role fails mid-request, the rest goes out again on a healthy path.

The router holds every token the client has seen. When the role serving a request fails (it could
not be reached or its stream broke, a 5xx, an abort the router did not ask for, an idle deadline),
the dispatcher asks `decide` whether and where to go on, and re-issues the request with
`resumed_request`: the prompt plus the tokens already streamed, `max_new_tokens` (and
`min_new_tokens`) reduced by what was sent, the same sampling parameters. The client's stream goes on
from the next token (`continued_finish` keeps a length finish counting from the client's start).

Paths (pure choice, from which roles have a peer in service):

* MD failed: another MD, on the pipeline the router's policy picks for the resumed request and that
  MD (`may_relay`): P->RLD->MD where the new MD misses much of the prompt plus what was sent (RLD,
  next to P, goes on at once while the KV crosses the WAN: the migration costs a prefill, not a WAN
  transfer), P->MD where it holds it; else P->RLD alone; else P->MD on the same MD (it may be back).
  After a stall (no chunk within the idle deadline) only an MD at another site counts as another
  MD: the WAN to the stalled MD's site may be down, and RLD is next to P. (The request's total
  timeout is the client's: it is not migrated.)
* RLD failed (before its handoff): P->MD (MD held the request's KV: its radix cache makes the new
  transfer cheap); else P->RLD on another relay.
* P failed: another P, on the pipeline the policy picks (`may_relay`), or P->RLD when no MD is in
  service.

Never migrated: a client's error (4xx, from any role), the router's own errors (a malformed chunk,
a stitching error), constrained decoding after tokens were sent (its grammar would start over), and
any failure past `--migration-limit` migrations.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_pdd.policy.pipeline import Pipeline

CAUSES = ("unreachable", "5xx", "abort", "broken", "timeout", "idle")
# A role that went silent rather than failing: for MD, as likely the WAN to its site as MD itself.
STALLS = ("idle", "timeout")
CONSTRAINED = ("regex", "json_schema", "ebnf", "structural_tag")


def cause_of(e: BaseException) -> str | None:
    """The migration cause of a role's failure, or None when it is not the role's fault (4xx) or not
    an upstream failure at all."""
    from sglang_pdd.router.peers.upstream import UpstreamError

    if not isinstance(e, UpstreamError):
        return None
    if e.status is not None and 400 <= e.status < 500:
        return None
    if e.kind in ("abort", "unreachable", "broken", "timeout"):
        return e.kind
    return "5xx"


@dataclass(frozen=True)
class Decision:
    pipeline: Pipeline | None  # None: do not migrate
    reason: str
    may_relay: bool = False  # P->MD here may go P->RLD->MD instead, if the pipeline policy says so


def decide(failed_role: str, cause: str | None, migrations: int, limit: int, sampling_params: dict,
           tokens_sent: int, *, main_ok: bool, relay_ok: bool) -> Decision:
    """Whether to migrate a request whose `failed_role` failed with `cause`, and on which pipeline.
    `main_ok`/`relay_ok`: a peer of that role other than the failed one is in service."""
    if cause is None:
        return Decision(None, "not a role's failure")
    if migrations >= limit:
        return Decision(None, f"migration limit {limit} reached")
    if tokens_sent and any(sampling_params.get(k) is not None for k in CONSTRAINED):
        return Decision(None, "constrained decoding cannot resume")
    if failed_role == "main":
        if main_ok:
            return Decision(Pipeline.P_MD, "another main", may_relay=relay_ok)
        if relay_ok:
            return Decision(Pipeline.P_RLD, "relay alone (no main in service)")
        return Decision(Pipeline.P_MD, "the same main")
    if failed_role == "relay" and main_ok:  # MD held the request's KV: its radix cache makes P->MD cheap
        return Decision(Pipeline.P_MD, "main")
    if main_ok or not relay_ok:
        return Decision(Pipeline.P_MD, "main", may_relay=failed_role == "prefill" and relay_ok)
    return Decision(Pipeline.P_RLD, "relay alone (no main in service)")


def resumed_request(input_ids: list[int], sampling_params: dict,
                    sent: list[int]) -> tuple[list[int], dict] | None:
    """The prompt and sampling parameters that produce the rest of the output after `sent`; None
    when nothing is left to generate."""
    sp = dict(sampling_params)
    left = int(sp.get("max_new_tokens") or 128) - len(sent)
    if left <= 0:
        return None
    sp["max_new_tokens"] = left
    if sp.get("min_new_tokens"):
        sp["min_new_tokens"] = max(0, int(sp["min_new_tokens"]) - len(sent))
    return list(input_ids) + list(sent), sp


def continued_finish(reason: dict | None, offset: int) -> dict | None:
    """A resumed copy's finish as the client's request would have ended: a length counts from the
    client's start."""
    if isinstance(reason, dict) and reason.get("type") == "length" and isinstance(reason.get("length"), int):
        return {**reason, "length": reason["length"] + offset}
    return reason
