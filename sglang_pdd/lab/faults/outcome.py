"""What happened to one request of a fault scenario: its record and its class.

Classes (one per request): `identical` (completed, token-identical to the single server, never
migrated), `migrated` (completed after a migration, token-identical), `failed` (a 4xx/5xx, an error
chunk or a dead connection, with a message), `hung` (past the client's deadline), `wrong` (completed
with tokens other than the reference's, a stream that went back, or one that ended with `[DONE]` but
no finish reason: silently wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLASSES = ("identical", "migrated", "failed", "hung", "wrong")


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    conv: int
    turn: int
    input_ids: list[int]
    max_new_tokens: int
    sampling: dict = field(default_factory=dict)  # beyond greedy: a seeded conversation's temperature, seed, ...
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict | None = None
    error: str = ""  # the error's message (HTTP status, error chunk or connection failure)
    hung: bool = False  # still running at the client's deadline
    went_back: bool = False  # a chunk's output_ids was not an extension of the previous one
    migrations: int = 0  # meta_info.pdd.migrations of the last chunk
    causes: list[str] = field(default_factory=list)
    ttft_s: float | None = None
    gap_s: float = 0.0  # largest gap between two chunks
    e2e_s: float = 0.0
    md: int | None = None  # meta_info.pdd.md.index
    handoff_tokens: int | None = None

    @property
    def completed(self) -> bool:
        return not self.hung and not self.error and self.finish_reason is not None


def end_of_stream(rec: RequestRecord, done: bool) -> None:
    """After the stream: one that ended with neither a finish reason nor SSE's `[DONE]` (nor an error)
    was cut, which the client can see (a client library may hide the broken chunked encoding)."""
    if not rec.error and not rec.hung and rec.finish_reason is None and not done:
        rec.error = "connection: the stream ended with no finish reason and no [DONE] (cut)"


def classify(rec: RequestRecord, identical: bool | None) -> str:
    """The request's class; `identical`: whether its tokens match the reference (None: not checked,
    only allowed for a request that did not complete)."""
    if rec.hung:
        return "hung"
    if rec.went_back:
        return "wrong"
    if rec.error:
        return "failed"
    if rec.finish_reason is None:  # the stream ended with neither a finish nor an error
        return "wrong"
    if identical is None:
        raise ValueError("a completed request needs its token check")
    if not identical:
        return "wrong"
    return "migrated" if rec.migrations else "identical"


def matches(reference, got: list[int]) -> bool:
    """Token identity against a `testing.identity.Reference` (a certified near tie counts as equal)."""
    from sglang_pdd.lab.testing import identity

    try:
        identity.check(reference, got, "fault scenario")
    except AssertionError:
        return False
    return True
