"""A bounded LRU radix cache over blocks (P's, RLD's and MD's caches on a block-level trace).

As sglang's `RadixCache`: a trie of cached prefixes shared by every request and session, whose
leaves are evicted in least-recently-used order when the cached tokens exceed the capacity (a
parent becomes evictable once its last child is gone). Here an edge is one block id of a
Mooncake trace (`workload.mooncake`): a node is "the prompt prefix ending with this block",
holding up to `block_tokens` tokens.

Partial blocks: a prompt's last block is usually partial, and block `b`'s partial tokens are a
prefix of its full tokens. sglang's default radix cache matches token by token (page size 1), so
a block matches for min(cached tokens, wanted tokens) and the match stops inside a block that is
shorter than wanted. Inserting a longer copy of a cached block extends the node.

Access: a match that touches refreshes every node on the matched path (sglang updates the last
access time along the path); `touch=False` is the router's read-only look-up. Inserting refreshes
the whole inserted path. There are no lock references: the KV of running requests is accounted
by the instances' reservations, apart from the cache (docs/sim.md, "Block-level prefix caches").
"""

from __future__ import annotations

import heapq
import math
from typing import Optional, Sequence

from sglang_pdd.lab.workload.request import WorkloadRequest


class _Node:
    __slots__ = ("block", "parent", "children", "tokens", "tick", "alive")

    def __init__(self, block: Optional[int], parent: Optional["_Node"], tokens: int, tick: int):
        self.block, self.parent, self.tokens, self.tick = block, parent, tokens, tick
        self.children: dict[int, _Node] = {}
        self.alive = True


class BlockRadixCache:
    def __init__(self, capacity_tokens: float = math.inf):
        if capacity_tokens <= 0:
            raise ValueError(f"cache capacity must be > 0 tokens, got {capacity_tokens}")
        self.capacity = capacity_tokens
        self.root = _Node(None, None, 0, 0)
        self.tokens = 0
        self.nodes = 0
        self.evicted_blocks = 0
        self.evicted_tokens = 0
        self._tick = 0
        self._seq = 0
        self._heap: list[tuple[int, int, _Node]] = []  # leaves by last access, lazily invalidated
        self._out_id = 0  # ids of output blocks (negative: never in a trace)

    # ----- block level -----
    def match(self, blocks: Sequence[int], lengths: Sequence[int], touch: bool = True) -> int:
        """Cached tokens at the head of the prompt `blocks` (block i holding `lengths[i]` tokens)."""
        node, hit, last = self.root, 0, None
        for b, n in zip(blocks, lengths):
            c = node.children.get(b)
            if c is None:
                break
            m = min(c.tokens, n)
            hit += m
            last = c
            if m < n:
                break
            node = c
        if touch and last is not None:
            self._touch(last)
        return hit

    def insert(self, blocks: Sequence[int], lengths: Sequence[int]) -> None:
        node = self.root
        for b, n in zip(blocks, lengths):
            c = node.children.get(b)
            if c is None:
                c = node.children[b] = _Node(b, node, n, 0)
                self.tokens += n
                self.nodes += 1
            elif n > c.tokens:
                self.tokens += n - c.tokens
                c.tokens = n
            node = c
        if node is not self.root:
            self._touch(node)
        self._evict()

    def _touch(self, node: _Node) -> None:
        self._tick += 1
        t = self._tick
        if not node.children:
            self._push(node, t)
        while node is not self.root:
            node.tick = t
            node = node.parent

    def _push(self, node: _Node, tick: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (tick, self._seq, node))
        if len(self._heap) > 4 * self.nodes + 1024:
            self._compact()

    def _compact(self) -> None:
        leaves, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n is not self.root:
                leaves.append((n.tick, 0, n))
        self._heap = [(t, i, n) for i, (t, _, n) in enumerate(leaves)]
        self._seq = len(leaves)
        heapq.heapify(self._heap)

    def _evict(self) -> None:
        while self.tokens > self.capacity and self._heap:
            tick, _, node = heapq.heappop(self._heap)
            if not node.alive or node.children or tick != node.tick:
                continue  # stale: evicted, no longer a leaf, or touched since
            parent = node.parent
            del parent.children[node.block]
            node.alive = False
            self.tokens -= node.tokens
            self.nodes -= 1
            self.evicted_blocks += 1
            self.evicted_tokens += node.tokens
            if parent is not self.root and not parent.children:
                self._push(parent, parent.tick)

    # ----- request level (the interface `Cluster` uses for every prefix cache) -----
    def peek_req(self, w: WorkloadRequest) -> int:
        """The hit of `w`'s prompt, leaving the LRU order alone (the router scoring)."""
        return self._capped(w, self.match(w.block_ids, w.block_lengths(), touch=False))

    def hit_req(self, w: WorkloadRequest) -> int:
        return self._capped(w, self.match(w.block_ids, w.block_lengths()))

    def insert_prompt(self, w: WorkloadRequest) -> None:
        self.insert(w.block_ids, w.block_lengths())

    def insert_finished(self, w: WorkloadRequest) -> None:
        """Prompt + output, as sglang caches a finished request. The output has no id in the
        trace, so it is a fresh block that takes space and never hits."""
        self._out_id -= 1
        self.insert(tuple(w.block_ids) + (self._out_id,), w.block_lengths() + [w.max_output_tokens])

    @staticmethod
    def _capped(w: WorkloadRequest, hit: int) -> int:
        """At least one prompt token is always computed (sglang's match leaves the last)."""
        return min(hit, w.input_len - 1) if w.input_len > 0 else 0
