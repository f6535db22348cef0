"""A role's compiled grammars are bounded (issue 47): sglang's grammar cache becomes an LRU of at most
MAX_GRAMMARS entries and MAX_GRAMMAR_BYTES, xgrammar's compiler cache gets a byte limit, on every PDD
role once its grammar manager is built; a plain server keeps sglang's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_pdd.config import ENV_CONFIG, PddConfig
from sglang_pdd.hooks import grammar as hook
from sglang_pdd.server import grammar_cache
from sglang_pdd.server.grammar_cache import BoundedCache, grammar_bytes
from sglang_pdd.server.roles import Role


def test_n_plus_one_distinct_entries_keep_n_the_oldest_out():
    c = BoundedCache(3)
    for i in range(4):
        c[("regex", f"a{i}")] = i
    assert len(c) == 3 and ("regex", "a0") not in c and list(c.values()) == [1, 2, 3]


def test_a_read_keeps_an_entry_in():
    c = BoundedCache(2)
    c["a"], c["b"] = 1, 2
    assert c.get("a") == 1  # "b" is now the least recently used
    c["c"] = 3
    assert sorted(c) == ["a", "c"]


def test_the_byte_bound_drops_the_oldest_until_it_holds():
    c = BoundedCache(100, max_bytes=10, weigh=lambda k, v: v)
    c["a"], c["b"], c["c"] = 4, 4, 4
    assert sorted(c) == ["b", "c"] and c.bytes == 8
    c["b"] = 1  # replacing an entry counts its new weight only
    assert c.bytes == 5
    c["big"] = 50  # one entry over the bound on its own is still kept (the newest)
    assert list(c) == ["big"] and c.bytes == 50
    c.clear()
    assert len(c) == 0 and c.bytes == 0


def test_an_unbounded_dict_grows_negative_control():
    d = {}
    for i in range(5000):
        d[("regex", f"a{i}")] = i
    assert len(d) == 5000  # sglang's own cache: what bound() replaces
    c = BoundedCache(grammar_cache.MAX_GRAMMARS)
    c.update(d)
    assert len(c) == grammar_cache.MAX_GRAMMARS


def test_grammar_bytes_counts_the_source_and_the_compiled_grammar():
    compiled = SimpleNamespace(ctx=SimpleNamespace(memory_size_bytes=1000))
    assert grammar_bytes(("json", "abc"), compiled) == 1003
    assert grammar_bytes(("json", "abc"), SimpleNamespace(grammar=compiled)) == 1003  # a reasoning wrapper's
    assert grammar_bytes(("json", "abc"), object()) == 3  # an invalid grammar: its source only


class FakeCompiler:
    def __init__(self, info, cache_limit_bytes: int = -1):
        self.info, self.cache_limit_bytes = info, cache_limit_bytes


def fake_backend(**kw):
    return SimpleNamespace(cache={("regex", "a+"): "compiled"}, grammar_compiler=FakeCompiler("info"),
                           _tokenizer_info="info", **kw)


def test_bound_replaces_the_cache_keeps_its_entries_and_limits_the_compiler():
    b = fake_backend()
    grammar_cache.bound(b)
    assert isinstance(b.cache, BoundedCache) and dict(b.cache) == {("regex", "a+"): "compiled"}
    assert b.cache.entries == grammar_cache.MAX_GRAMMARS and b.cache.max_bytes == grammar_cache.MAX_GRAMMAR_BYTES
    assert isinstance(b.grammar_compiler, FakeCompiler) and b.grammar_compiler.info == "info"
    assert b.grammar_compiler.cache_limit_bytes == grammar_cache.MAX_COMPILER_CACHE_BYTES
    cache = b.cache
    grammar_cache.bound(b)  # twice: nothing changes
    assert b.cache is cache


def test_bound_reaches_through_a_reasoning_wrapper():
    inner = fake_backend()
    outer = SimpleNamespace(cache={}, grammar_backend=inner)
    grammar_cache.bound(outer)
    assert isinstance(outer.cache, BoundedCache) and isinstance(inner.cache, BoundedCache)
    assert inner.grammar_compiler.cache_limit_bytes == grammar_cache.MAX_COMPILER_CACHE_BYTES


def scheduler(backend):
    return SimpleNamespace(grammar_manager=SimpleNamespace(grammar_backend=backend))


@pytest.mark.parametrize("role", list(Role))
def test_the_hook_bounds_every_roles_cache(monkeypatch, role):
    monkeypatch.setenv(ENV_CONFIG, PddConfig(role=role).to_json())
    s = scheduler(fake_backend())
    assert hook.after_init_grammar_manager(None, s) is None
    assert isinstance(s.grammar_manager.grammar_backend.cache, BoundedCache)


def test_the_hook_is_inert_on_a_plain_server_and_without_grammars(monkeypatch):
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    s = scheduler(fake_backend())
    hook.after_init_grammar_manager(None, s)
    assert type(s.grammar_manager.grammar_backend.cache) is dict  # a plain server: sglang's own
    monkeypatch.setenv(ENV_CONFIG, PddConfig(role=Role.MAIN).to_json())
    hook.after_init_grammar_manager(None, scheduler(None))  # --grammar-backend none: nothing to bound


def test_a_real_xgrammar_backend_is_bounded(tiny_model, monkeypatch):
    """sglang's own XGrammarGrammarBackend over the tiny model's tokenizer: its cache and its compiler."""
    pytest.importorskip("xgrammar")
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    b = XGrammarGrammarBackend(AutoTokenizer.from_pretrained(tiny_model), vocab_size=2048)
    assert type(b.cache) is dict and b.grammar_compiler.cache_limit_bytes == -1  # sglang's, unbounded
    grammar_cache.bound(b)
    assert isinstance(b.cache, BoundedCache)
    assert b.grammar_compiler.cache_limit_bytes == grammar_cache.MAX_COMPILER_CACHE_BYTES
    g = b.dispatch_regex("[a-z]{3}")
    b.set_cache(("regex", "[a-z]{3}"), g)
    assert b.cache.bytes > len("[a-z]{3}")  # its compiled size counted
