"""A bare Mooncake TCP transfer engine for the benchmarks' two ends (wan_pack, handoff_peers).

Each end is a process in one testbed namespace: `tcp_engine(host)` starts an engine there (P2P
handshake, no metadata server), `register` makes a tensor's memory a source or target of writes.
Needs `mooncake-transfer-engine(-non-cuda)`.
"""

from __future__ import annotations

from typing import Any

import torch

# One batch of 2048 slices failed with Mooncake TCP here (1032 went through): writes go in batches of
# at most this many slices (sglang: bounded index batches, `max_transfer_batch_indices`).
MAX_BATCH_SLICES = 1024


def tcp_engine(host: str) -> Any:
    """A TransferEngine on `host` over TCP with P2P handshake."""
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize({host}) returned {rc}")
    return engine


def register(engine: Any, t: torch.Tensor) -> None:
    """Register `t`'s memory with `engine`."""
    rc = engine.register_memory(t.data_ptr(), t.numel() * t.element_size())
    if rc != 0:
        raise RuntimeError(f"register_memory returned {rc}")
