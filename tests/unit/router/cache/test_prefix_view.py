"""The router's approximate view of MD's radix cache (issue 14 item 4): a bounded radix tree that
evicts least recently used leaves, whose insert and match cost one path whatever it holds."""

import random

import pytest

from sglang_pdd.router.cache import prefix_view
from sglang_pdd.router.cache.prefix_view import PrefixView


def test_matches_page_granular_prefixes_and_forgets_the_least_recently_used():
    v = PrefixView(page_size=2, max_tokens=9)
    v.insert([1, 2, 3, 4, 5])  # holds 4 tokens: the half page is not kept
    assert v.match([1, 2, 3, 4, 9]) == 4 and v.match([1, 2, 3]) == 2 and v.match([7]) == 0
    v.insert([7, 8, 9, 10, 11, 12])  # 10 tokens > 9: the first sequence goes
    assert v.match([1, 2]) == 0 and v.match([7, 8, 9, 10, 11, 12]) == 6
    assert v.tokens == 6


def test_a_match_keeps_what_it_matched_as_md_does():
    v = PrefixView(max_tokens=8)
    v.insert([1, 1, 1, 1])
    v.insert([2, 2, 2, 2])
    assert v.match([1, 1, 1, 1]) == 4  # used: now the newest
    v.insert([3, 3, 3, 3])  # over the bound: [2, 2, 2, 2] was the least recently used
    assert (v.match([1, 1, 1, 1]), v.match([2, 2, 2, 2]), v.match([3, 3, 3, 3])) == (4, 0, 4)


def test_a_shared_prefix_counts_once_like_mds_pool():
    v = PrefixView(max_tokens=1200)
    system = list(range(1000))
    for i in range(100):  # 100 conversations on one 1000-token system prompt: 1100 tokens in all
        v.insert(system + [5000 + i])
    assert v.tokens == 1100
    assert all(v.match(system + [5000 + i, 7]) == 1001 for i in range(100))


def test_eviction_removes_leaves_first_and_keeps_the_shared_trunk():
    v = PrefixView(max_tokens=12)
    v.insert([1] * 8 + [2, 2])
    v.insert([1] * 8 + [3, 3])
    v.insert([1] * 8 + [4, 4])  # 14 > 12: the oldest branch [2, 2] goes, the trunk stays
    assert v.match([1] * 8 + [2, 2]) == 8 and v.match([1] * 8 + [4, 4]) == 10 and v.tokens == 12


def test_it_agrees_with_a_brute_force_reference_when_nothing_is_evicted():
    rng = random.Random(5)
    v, seqs = PrefixView(page_size=4, max_tokens=1 << 30), []
    for _ in range(300):
        base = rng.choice(seqs) if seqs and rng.random() < 0.7 else []
        s = base[: rng.randrange(len(base) + 1)] + [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        v.insert(s)
        seqs.append(s)
    for _ in range(300):
        q = rng.choice(seqs)[: rng.randrange(1, 60)] + [rng.randrange(6) for _ in range(rng.randrange(5))]

        def common(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n // 4 * 4

        assert v.match(q) == max(common(q, s[: len(s) // 4 * 4]) for s in seqs)


def test_it_never_holds_more_than_its_bound():
    rng = random.Random(9)
    v = PrefixView(page_size=2, max_tokens=500)
    for _ in range(2000):
        v.insert([rng.randrange(4) for _ in range(rng.randrange(1, 120))])
        assert v.tokens <= 500
        assert v.tokens == _count(v._root)


def _count(node) -> int:
    return len(node.key) + sum(_count(c) for c in node.children.values())


@pytest.mark.parametrize("page", [1, 16])
def test_an_insert_into_a_full_view_builds_one_path_not_the_whole_tree(monkeypatch, page):
    """The old view rebuilt its trie from every survivor on each eviction: O(view) per insert."""
    v = PrefixView(page_size=page, max_tokens=20_000)
    for i in range(200):
        v.insert([i + 1000] * 100 + list(range(i * 10, i * 10 + 100)))
    assert v.tokens <= 20_000
    made = []

    class Counting(prefix_view._Node):
        __slots__ = ()

        def __init__(self, *a, **kw):
            made.append(1)
            super().__init__(*a, **kw)

    monkeypatch.setattr(prefix_view, "_Node", Counting)
    v.insert([7] * 320)  # evicts
    v.match([7] * 320)
    assert len(made) <= 2 * 320 // page + 2
