"""A role's compiled grammars, bounded: one client cannot grow a role's memory by sending grammars.

sglang 0.5.23 keeps every grammar it compiled in two places, neither ever evicted: its grammar
backend's `cache` (a plain dict of (kind, source) -> grammar object, holding the compiled grammar)
and, on its default backend, xgrammar's `GrammarCompiler` cache (no byte limit). A client sending
distinct grammars grows both without end, on P, RLD and MD alike. `bound(backend)` replaces the first
with a `BoundedCache` (least recently used out past `MAX_GRAMMARS` entries or `MAX_GRAMMAR_BYTES` of
compiled grammar) and gives the xgrammar compiler a byte limit (`MAX_COMPILER_CACHE_BYTES`). A
request whose grammar was evicted compiles it again; a request already running keeps its own copy.

`BoundedCache` is also the router's cache of grammar verdicts (`router.api.grammar.guard`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

MAX_GRAMMARS = 1024  # compiled grammars a role keeps (sglang: no bound)
MAX_GRAMMAR_BYTES = 1 << 30  # and their compiled size (xgrammar's CompiledGrammar.memory_size_bytes)
MAX_COMPILER_CACHE_BYTES = 1 << 30  # xgrammar's own compiler cache (sglang: -1, no limit)


class BoundedCache(MutableMapping):
    """A mapping that keeps at most `entries` items and at most `max_bytes` of their weight
    (`weigh(key, value)`; None: no byte bound), dropping the least recently used (read or written)."""

    def __init__(self, entries: int, max_bytes: int | None = None,
                 weigh: Callable[[Any, Any], int] | None = None):
        if entries < 1:
            raise ValueError("a bounded cache holds at least one entry")
        self.entries, self.max_bytes, self._weigh = entries, max_bytes, weigh
        self._items: OrderedDict = OrderedDict()  # key -> (value, weight)
        self.bytes = 0

    def __getitem__(self, key):
        value, _ = self._items[key]
        self._items.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        if key in self._items:
            del self[key]
        weight = self._weigh(key, value) if self._weigh is not None else 0
        self._items[key] = (value, weight)
        self.bytes += weight
        while len(self._items) > self.entries or (self.max_bytes is not None and self.bytes > self.max_bytes
                                                  and len(self._items) > 1):
            _, (_, w) = self._items.popitem(last=False)
            self.bytes -= w

    def __delitem__(self, key) -> None:
        _, w = self._items.pop(key)
        self.bytes -= w

    def __contains__(self, key) -> bool:  # not a use: the order stays
        return key in self._items

    def __iter__(self) -> Iterator:  # oldest first; a snapshot (reading values moves them)
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


def grammar_bytes(key, value) -> int:
    """What one entry of sglang's grammar cache holds: its source and the compiled grammar (an
    xgrammar grammar's `ctx`, also through a reasoning wrapper's `grammar`; 0 for what has neither)."""
    source = key[1] if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], str) else ""
    for obj in (value, getattr(value, "grammar", None)):
        size = getattr(getattr(obj, "ctx", None), "memory_size_bytes", None)
        if isinstance(size, int):
            return len(source) + size
    return len(source)


def bound(backend) -> None:
    """`backend` (sglang's grammar backend, and a reasoning wrapper's inner one) with bounded caches:
    each grammar cache a `BoundedCache` (what it held is kept, up to the bounds), each xgrammar
    compiler without a byte limit replaced by one with `MAX_COMPILER_CACHE_BYTES` (sglang's other
    settings: its default threads, the same tokenizer)."""
    for b in (backend, getattr(backend, "grammar_backend", None)):
        if b is None:
            continue
        if not isinstance(b.cache, BoundedCache):
            cache = BoundedCache(MAX_GRAMMARS, MAX_GRAMMAR_BYTES, grammar_bytes)
            cache.update(b.cache)
            b.cache = cache
        compiler, info = getattr(b, "grammar_compiler", None), getattr(b, "_tokenizer_info", None)
        if compiler is not None and info is not None and compiler.cache_limit_bytes < 0:
            b.grammar_compiler = type(compiler)(info, cache_limit_bytes=MAX_COMPILER_CACHE_BYTES)
