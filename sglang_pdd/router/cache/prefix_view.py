"""An approximate view of one MainDecode's radix cache, kept by the router from what it sent there.

Every request that ended on MD left prompt + output in MD's decode radix cache (both pipelines end
at MD). The router records those token sequences in a page-granular radix tree and answers "how many
leading tokens of this prompt would MD match". It does not see MD's evictions: the view is an upper
bound that is exact until MD's pool fills up (an exact view from sglang's KV events is `exact_view`).

The tree is bounded: it holds at most `max_tokens` tokens (a shared prefix counts once, as in MD's
pool) and evicts least recently used leaves, as MD's radix cache does; a match refreshes what it
matched. Insert and match walk one path: O(prompt) whatever the tree holds; an eviction removes one
leaf (amortised O(log n) through a heap of leaf stamps).
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("key", "children", "parent", "stamp")

    def __init__(self, key: tuple[int, ...], parent: "_Node | None", stamp: int):
        self.key = key  # whole pages
        self.children: dict[tuple[int, ...], _Node] = {}  # by first page
        self.parent = parent
        self.stamp = stamp  # last use (the view's counter)


class PrefixView:
    def __init__(self, page_size: int = 1, max_tokens: int = 1 << 22):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.page = page_size
        self.max_tokens = max_tokens
        self._clock = itertools.count(1)
        self._root = _Node((), None, 0)
        self._tokens = 0  # tokens held (the sum of every node's key)
        self._nodes = 0
        self._leaves: list[tuple[int, int, _Node]] = []  # (stamp, tie, node): lazy, stale entries skipped
        self._tie = itertools.count()

    @property
    def tokens(self) -> int:
        return self._tokens

    def _first(self, ids: tuple[int, ...], i: int) -> tuple[int, ...]:
        return ids[i:i + self.page]

    def _common(self, key: tuple[int, ...], ids: tuple[int, ...], i: int) -> int:
        """Tokens (whole pages) of `key` that `ids[i:]` starts with."""
        n = min(len(key), (len(ids) - i) // self.page * self.page)
        if ids[i:i + n] == key[:n]:
            return n
        lo, hi = 0, n // self.page  # pages: lo known equal, hi known different
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ids[i:i + mid * self.page] == key[:mid * self.page]:
                lo = mid
            else:
                hi = mid
        return lo * self.page

    def _walk(self, ids: tuple[int, ...], stamp: int):
        """Follow `ids` from the root, stamping every node on the way; returns the last node, the
        tokens matched, and how many tokens of that node's key matched."""
        node, i = self._root, 0
        node.stamp = stamp
        while True:
            child = node.children.get(self._first(ids, i))
            if child is None:
                return node, i, len(node.key)
            child.stamp = stamp
            n = self._common(child.key, ids, i)
            i += n
            if n < len(child.key):
                return child, i, n
            node = child

    def insert(self, ids: list[int]) -> None:
        key = tuple(ids[: len(ids) // self.page * self.page])
        stamp = next(self._clock)
        node, i, n = self._walk(key, stamp)
        if n < len(node.key):  # split: node keeps its first n tokens, the rest becomes its child
            rest = _Node(node.key[n:], node, node.stamp)
            rest.children = node.children
            for c in rest.children.values():
                c.parent = rest
            node.key, node.children = node.key[:n], {self._first(rest.key, 0): rest}
            self._nodes += 1
            if not rest.children:
                self._push(rest)
        if i < len(key):
            leaf = _Node(key[i:], node, stamp)
            node.children[self._first(key, i)] = leaf
            self._tokens += len(leaf.key)
            self._nodes += 1
            self._push(leaf)
        elif node is not self._root and not node.children:
            self._push(node)
        self._evict()

    def match(self, ids: list[int]) -> int:
        """Leading tokens of `ids` the view holds (whole pages); refreshes what matched."""
        key = tuple(ids[: len(ids) // self.page * self.page])
        node, i, _ = self._walk(key, next(self._clock))
        if node is not self._root and not node.children:
            self._push(node)
        return i

    def _push(self, leaf: _Node) -> None:
        heapq.heappush(self._leaves, (leaf.stamp, next(self._tie), leaf))
        if len(self._leaves) > 4 * self._nodes + 64:  # drop stale entries now and then
            self._leaves = [e for e in self._leaves if self._live_leaf(*e)]
            heapq.heapify(self._leaves)

    def _live_leaf(self, stamp: int, _tie: int, node: _Node) -> bool:
        return node.stamp == stamp and not node.children and node.parent is not None

    def _evict(self) -> None:
        """Least recently used leaves go until the bound holds (what this call used is the newest)."""
        while self._tokens > self.max_tokens and self._leaves:
            entry = heapq.heappop(self._leaves)
            if self._live_leaf(*entry):
                self._remove(entry[2])

    def _remove(self, node: _Node) -> None:
        parent = node.parent
        del parent.children[self._first(node.key, 0)]
        node.parent = None
        self._tokens -= len(node.key)
        self._nodes -= 1
        if parent is not self._root and not parent.children:
            self._push(parent)
