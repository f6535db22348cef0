"""An exact view of one MainDecode's decode radix cache, rebuilt from sglang's KV events.

sglang publishes every block (one page of KV) its radix cache stores or removes: `BlockStored`
carries the new blocks' hashes, the hash of the block before the first one (None at the tree root)
and their token IDs; `BlockRemoved` carries hashes; `AllBlocksCleared` empties the cache. A block
hash depends on the whole prefix up to it, so the blocks form a tree keyed by (parent hash, tokens).
`match(ids)` walks that tree from the root: the number of leading tokens whose every block MD holds
(on any storage medium: a host-memory hit still saves the WAN transfer).

The view is exact only while it has seen every event since a known state (MD's start, or an
`AllBlocksCleared`). `kv_events.KvEventFeed` decides that from the publisher's sequence numbers and
calls `mark_stale` when it lost events it could not replay; a stale view answers from its fallback,
the router's approximate `PrefixView` (fed by `insert`, which the exact part ignores), until the feed
re-establishes a known state (`mark_exact`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_pdd.router.cache.prefix_view import PrefixView

logger = logging.getLogger(__name__)

ROOT: None = None  # the parent hash of a block at the root of MD's tree


@dataclass(slots=True)
class _Block:  # one per page MD holds: kept small
    parent: int | None
    tokens: tuple[int, ...]
    media: int = 0  # bit set of the storage media holding it (`ExactCacheView._medium_bits`)


class ExactCacheView:
    """Blocks MD holds, by hash; answers `match` exactly while `exact`, else from `fallback`."""

    def __init__(self, fallback: PrefixView | None = None, name: str = "main"):
        self.fallback = fallback if fallback is not None else PrefixView()
        self.name = name
        self._blocks: dict[int, _Block] = {}
        # (parent hash) -> {tokens of the child block: child hash}; entries outlive a removed parent
        # so that its children, if MD still holds them, are reachable again once it is re-stored.
        self._children: dict[int | None, dict[tuple[int, ...], int]] = {}
        self._sizes: dict[int, int] = {}  # block length -> how many held blocks have it
        self._medium_bits: dict[str, int] = {}
        self.exact = False
        self.stale_reason = "no events yet"

    # -- what the router asks -------------------------------------------------------------------
    def insert(self, ids: list[int]) -> None:
        """What the router sent to MD: only the fallback learns from it (events are the truth)."""
        self.fallback.insert(ids)

    def match(self, ids: list[int]) -> int:
        return self.exact_match(ids) if self.exact else self.fallback.match(ids)

    def exact_match(self, ids: list[int]) -> int:
        """Leading tokens of `ids` covered by held blocks (what the events say, exact or not)."""
        parent: int | None = ROOT
        n = 0
        sizes = sorted(self._sizes, reverse=True)
        while True:
            kids = self._children.get(parent)
            if not kids:
                return n
            for size in sizes:
                if n + size > len(ids):
                    continue
                h = kids.get(tuple(ids[n:n + size]))
                if h is not None and h in self._blocks:
                    parent, n = h, n + size
                    break
            else:
                return n

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    # -- what the events say --------------------------------------------------------------------
    def store(self, hashes: list[int], parent: int | None, token_ids: list[int], block_size: int,
              medium: str = "GPU") -> None:
        """One `BlockStored`: consecutive blocks, the first one's parent given, `block_size` tokens
        each (the last may be shorter). An unknown parent is fine: the blocks wait, unreachable, until
        it is stored."""
        if block_size < 1 or not hashes or len(token_ids) > block_size * len(hashes) \
                or len(token_ids) <= block_size * (len(hashes) - 1):
            raise ValueError(f"BlockStored: {len(hashes)} blocks of {block_size} tokens "
                             f"do not fit {len(token_ids)} token ids")
        for i, h in enumerate(hashes):
            tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
            block = self._blocks.get(h)
            if block is None or block.parent != parent or block.tokens != tokens:
                if block is not None:  # same hash, other content: the newest store wins
                    self._forget(h, block)
                block = _Block(parent, tokens)
                self._blocks[h] = block
                self._children.setdefault(parent, {})[tokens] = h
                self._sizes[len(tokens)] = self._sizes.get(len(tokens), 0) + 1
            block.media |= self._bit(medium)
            parent = h

    def remove(self, hashes: list[int], medium: str = "GPU") -> int:
        """One `BlockRemoved`: these blocks left `medium`. Unknown hashes are ignored (returned
        count), a block leaves the view once no medium holds it."""
        unknown = 0
        for h in hashes:
            block = self._blocks.get(h)
            if block is None:
                unknown += 1
                continue
            block.media &= ~self._bit(medium)
            if not block.media:
                self._forget(h, block)
        return unknown

    def clear(self) -> None:
        """`AllBlocksCleared` (or a publisher that restarted): MD holds nothing."""
        self._blocks.clear()
        self._children.clear()
        self._sizes.clear()

    def _bit(self, medium: str) -> int:
        bit = self._medium_bits.get(medium)
        if bit is None:
            bit = self._medium_bits[medium] = 1 << len(self._medium_bits)
        return bit

    def _forget(self, h: int, block: _Block) -> None:
        del self._blocks[h]
        kids = self._children.get(block.parent)
        if kids is not None and kids.get(block.tokens) == h:
            del kids[block.tokens]
            if not kids:
                del self._children[block.parent]
        n = len(block.tokens)
        self._sizes[n] -= 1
        if not self._sizes[n]:
            del self._sizes[n]

    # -- whether to trust it --------------------------------------------------------------------
    def mark_exact(self, why: str) -> None:
        if not self.exact:
            logger.info("%s: exact view of MD's cache from its KV events (%s)", self.name, why)
        self.exact, self.stale_reason = True, ""

    def mark_stale(self, why: str) -> None:
        if self.exact or self.stale_reason != why:
            logger.warning("%s: KV event view is stale (%s); routing on the approximate view until "
                           "MD's cache is known again", self.name, why)
        self.exact, self.stale_reason = False, why
