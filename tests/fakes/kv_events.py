"""Frames of sglang's KV events as MD's ZMQ publisher sends them, for the cache tests."""

from __future__ import annotations

import msgspec


def stored(hashes, parent, tokens, block_size=1, medium="GPU", **extra) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": medium, **extra}


def removed(hashes, medium="GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


CLEARED = {"type": "AllBlocksCleared"}


def payload(*events) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), None])  # sglang's EventBatch: [ts, events, dp_rank]


def msg(seq: int, *events) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload(*events)]


def chain(tokens, first_hash=100, parent=None) -> dict:
    """Page-size-1 blocks for `tokens`, hashes first_hash, first_hash+1, ..."""
    return stored(range(first_hash, first_hash + len(tokens)), parent, tokens)
