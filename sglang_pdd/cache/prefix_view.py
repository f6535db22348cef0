"""An approximate view of one MainDecode's radix cache, kept by the router from what it sent there.

Every request that ended on MD left prompt + output in MD's decode radix cache (both pipelines end
at MD). The router records those token sequences in a page-granular trie and answers "how many
leading tokens of this prompt would MD match". It does not see MD's evictions: the view is an upper
bound that is exact until MD's pool fills up (an exact view from sglang's KV events comes later).
A bound on the number of tokens kept (LRU by sequence) keeps the router's memory flat.
"""

from __future__ import annotations

from collections import OrderedDict


class _Node:
    __slots__ = ("children",)

    def __init__(self):
        self.children: dict[tuple[int, ...], _Node] = {}


class PrefixView:
    def __init__(self, page_size: int = 1, max_tokens: int = 1 << 22):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page = page_size
        self.max_tokens = max_tokens
        self._root = _Node()
        self._seqs: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._tokens = 0

    def _pages(self, ids: list[int]):
        for i in range(0, len(ids) - len(ids) % self.page, self.page):
            yield tuple(ids[i:i + self.page])

    def insert(self, ids: list[int]) -> None:
        key = tuple(ids)
        if key in self._seqs:
            self._seqs.move_to_end(key)
            return
        node = self._root
        for page in self._pages(ids):
            node = node.children.setdefault(page, _Node())
        self._seqs[key] = None
        self._tokens += len(ids)
        while self._tokens > self.max_tokens and len(self._seqs) > 1:
            self._evict_oldest()

    def match(self, ids: list[int]) -> int:
        node, n = self._root, 0
        for page in self._pages(ids):
            node = node.children.get(page)
            if node is None:
                break
            n += self.page
        return n

    def _evict_oldest(self) -> None:
        old, _ = self._seqs.popitem(last=False)
        self._tokens -= len(old)
        self._root = _Node()  # rebuild from the survivors: simple, and eviction is rare
        for seq in self._seqs:
            node = self._root
            for page in self._pages(list(seq)):
                node = node.children.setdefault(page, _Node())
