"""The router's view of MainDecode's prefix cache: approximate (`prefix_view`, from what the router
sent) or exact (`exact_view`, from MD's KV events, `kv_events`)."""

from __future__ import annotations

from typing import Protocol


class CacheView(Protocol):
    def insert(self, ids: list[int]) -> None:
        """The router sent these tokens to MD (prompt, or prompt + output)."""

    def match(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` MD holds in its decode radix cache."""
