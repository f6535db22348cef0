"""Scheduler: a PDD role's compiled grammars bounded once its grammar manager is built (see
server.grammar_cache). Inert on a plain server and where grammars are off (`--grammar-backend none`)."""

from __future__ import annotations

from sglang_pdd.config import PddConfig
from sglang_pdd.server import grammar_cache


def after_init_grammar_manager(_result, scheduler, *a, **kw) -> None:
    backend = getattr(scheduler.grammar_manager, "grammar_backend", None)
    if backend is not None and PddConfig.from_env().active:
        grammar_cache.bound(backend)
