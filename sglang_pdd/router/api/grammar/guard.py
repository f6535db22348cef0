"""A request's grammar compiled by the router, within bounds, before any role sees it.

A grammar (`json_schema`, `regex`, `ebnf` or `structural_tag` in the sampling parameters a role gets,
the ones sglang's chat layer builds from `response_format` and `tools` included) is compiled on every
role that serves the request (P, RLD and MD), in threads of the role's scheduler process that nothing
stops: xgrammar compiles some short grammars for minutes or into gigabytes (a deeply nested schema,
thousands of `patternProperties`), and a NUL crashed its regex converter. So the router compiles
each one first, as the roles would (`router.api.grammar.compile`), in worker processes
(`router.api.grammar.workers`) bounded by `--grammar-compile-timeout-s` (wall clock and CPU),
`--grammar-compile-memory-mb` (address space) and `--grammar-workers`. What does not compile within
them is a 400 naming the client's field (the sampling parameter, or `response_format` / `tools` for
a chat body) and the bound; a grammar the compiler refuses is a 400 with its message; only a
grammar that compiled goes on to the roles, which compile it again (at least as fast: they run 8
compiler threads, the router's workers one) and keep it in their bounded caches
(`server.grammar_cache`). The event loop only awaits a future.

Verdicts are kept in a `BoundedCache` of `MAX_VERDICTS`, keyed by a SHA-256 of the field and the
source: a repeated grammar costs nothing, a flood of distinct ones cannot grow the router. Requests
with the same grammar share one compile. Compiles running or waiting are at most `capacity`
(`QUEUE_PER_WORKER` waiting per worker): past it a request gets 503 with Retry-After (`GrammarBusy`,
counted as refused{reason="grammar-queue"}), as a full tokenizer queue does. A compile whose client
went away still finishes (within the bound) and its verdict is kept.

Without xgrammar installed beside the router (the `router` extra does not pull it, nor torch) no
grammar can be checked, so every request with one is a 400 saying so; start-up logs a warning.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
from dataclasses import dataclass

from sglang_pdd.router.api.grammar import compile as gc
from sglang_pdd.router.api.admission import BadRequest
from sglang_pdd.router.api.grammar.workers import GrammarWorkers
from sglang_pdd.server.grammar_cache import BoundedCache

MAX_VERDICTS = 4096  # grammar verdicts kept (a 32-byte key and a short message each)
QUEUE_PER_WORKER = 4  # compiles waiting for a worker, per worker


@dataclass(frozen=True)
class GrammarBounds:
    timeout_s: float = 5.0  # --grammar-compile-timeout-s
    memory_mb: int = 2048  # --grammar-compile-memory-mb
    workers: int = 2  # --grammar-workers

    def __post_init__(self):
        if not (self.timeout_s > 0 and self.memory_mb > 0 and self.workers > 0):
            raise ValueError("--grammar-compile-timeout-s, --grammar-compile-memory-mb and --grammar-workers must "
                             "be positive")


class GrammarBusy(RuntimeError):
    """No compile can be taken now: the router answers 503 with Retry-After. `reason`: the refusal it
    counts (None: the workers could not start, not a refusal of the client's)."""

    def __init__(self, message: str, reason: str | None = "grammar-queue"):
        super().__init__(message)
        self.reason = reason


def client_field(field: str, body: dict | None) -> str:
    """The client's name for a grammar: the sampling parameter it sent, else what sglang's chat layer
    built it from (`response_format`, `tools`)."""
    if body is None or field in body or "sampling_params" in body:
        return field
    if body.get("response_format") not in (None, {"type": "text"}):
        return "response_format"
    return "tools" if body.get("tools") else field


class GrammarGuard:
    def __init__(self, tokenizer, vocab_size: int | None, bounds: GrammarBounds = GrammarBounds()):
        self.bounds = bounds
        self.available = importlib.util.find_spec("xgrammar") is not None
        self.capacity = bounds.workers * (1 + QUEUE_PER_WORKER)
        self.verdicts = BoundedCache(MAX_VERDICTS)
        self._compiling: dict[bytes, asyncio.Future] = {}
        self.workers = GrammarWorkers(tokenizer, vocab_size, bounds.workers, bounds.memory_mb) \
            if self.available else None

    def start(self) -> None:
        """Start the workers now rather than at the first grammar (the router's command does)."""
        if self.workers is not None:
            self.workers.start()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()

    @property
    def pending(self) -> int:
        """Compiles running or waiting for a worker."""
        return len(self._compiling)

    async def check(self, sampling_params: dict, body: dict | None = None) -> None:
        """Returns when the request's grammar (if any) compiled within the bounds; raises BadRequest when
        it does not, GrammarBusy when no compile can be taken now."""
        field = next((f for f in gc.FIELDS if sampling_params.get(f) is not None), None)
        if field is None:
            return
        name = client_field(field, body)
        if not self.available:
            raise BadRequest(f"{name}: this router cannot check grammars (xgrammar is not installed beside it), "
                             "so it serves none")
        source = sampling_params[field]
        key = hashlib.sha256(f"{field}\0{source}".encode("utf-8", "surrogatepass")).digest()
        verdict = self.verdicts.get(key)
        if verdict is None:
            verdict = await self._compiled(key, field, source, name)
        if verdict.status == gc.UNAVAILABLE:
            raise GrammarBusy(f"{name}: the router's grammar workers cannot start ({verdict.detail}); retry later",
                              reason=None)
        if verdict.status != gc.OK:
            raise BadRequest(self.message(name, verdict))

    async def _compiled(self, key: bytes, field: str, source: str, name: str) -> gc.Verdict:
        job = self._compiling.get(key)
        if job is None:
            if len(self._compiling) >= self.capacity:
                raise GrammarBusy(f"{name}: the router's grammar compiles are all taken ({self.capacity} running "
                                  "or waiting; --grammar-workers); retry later")
            job = asyncio.wrap_future(self.workers.submit(field, source, self.bounds.timeout_s))
            self._compiling[key] = job
            job.add_done_callback(lambda j: self._settle(key, j))
        return await asyncio.shield(job)  # a client that leaves does not stop a compile others may share

    def _settle(self, key: bytes, job: asyncio.Future) -> None:
        self._compiling.pop(key, None)
        if not job.cancelled() and job.exception() is None and job.result().status != gc.UNAVAILABLE:
            self.verdicts[key] = job.result()

    def message(self, name: str, verdict: gc.Verdict) -> str:
        b = self.bounds
        if verdict.status == gc.TIME:
            return f"{name}: the grammar did not compile within {b.timeout_s:g} s (--grammar-compile-timeout-s)"
        if verdict.status == gc.MEMORY:
            return f"{name}: compiling the grammar needs more than {b.memory_mb} MB (--grammar-compile-memory-mb)"
        if verdict.status == gc.CRASHED:
            return f"{name}: the grammar compiler crashed on this grammar ({verdict.detail})"
        return f"{name}: the grammar does not compile: {verdict.detail}"
