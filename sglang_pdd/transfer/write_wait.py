"""Mooncake KV writes that wait without spinning a core (`--pdd-transfer-poll-ms`).

sglang's transfer workers write with `MooncakeTransferEngine.batch_transfer_sync`, i.e. Mooncake's
`batch_transfer_sync_write` (mooncake-integration/transfer_engine/transfer_engine_py.cpp,
`TransferEnginePy::batchTransferSync`): it submits the batch, then loops on
`getBatchTransferStatus` with no sleep or yield until the batch completes. The worker thread spins
a core for the whole write: over a 100 Mbit/s WAN a cold 2K-token turn's 31 MiB is ~2.8 s of one
core on P, per write in flight, on a box whose cores the decoders need.

`write()` does the same write and waits politely: each slice is submitted as its own one-entry batch
(`transfer_submit_write`; the binding's only status check that does not itself loop,
`transfer_check_status`, reads a batch's first task), then the slices are checked in order, with
sleeps backing off from `FIRST_SLEEP_S` to `max_sleep_s` between checks (a short write costs at most
a few tens of microseconds more; a long one wakes ~1/max_sleep_s times a second). Same result as the
sync call: 0 when every slice landed, -1 otherwise, and Mooncake's timeout (`MC_TRANSFER_TIMEOUT`,
30 s, at least 5, plus one second per GiB).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Sequence

logger = logging.getLogger(__name__)

FIRST_SLEEP_S = 50e-6
_BAD_IDS = (0, -1, (1 << 64) - 1)  # transfer_submit_write's failures (-1 as a uint64_t)
DONE, PENDING, FAILED, TIMEOUT = 1, 0, -1, -2  # transfer_check_status


def timeout_s(total_bytes: int, environ: dict | None = None) -> float:
    env = environ if environ is not None else os.environ
    try:
        base = max(5, int(env.get("MC_TRANSFER_TIMEOUT", "30")))
    except ValueError:
        base = 30
    return base + total_bytes / float(1 << 30)


def supported(engine: Any) -> bool:
    """Whether the Mooncake binding has the calls `write()` needs."""
    return hasattr(engine, "transfer_submit_write") and hasattr(engine, "transfer_check_status")


def write(engine: Any, session_id: str, buffers: Sequence[int], peer_addresses: Sequence[int],
          lengths: Sequence[int], max_sleep_s: float, *, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> int:
    """`batch_transfer_sync_write(session_id, buffers, peer_addresses, lengths)` on the Mooncake
    binding `engine`, waiting with sleeps instead of a spin. 0 on success, -1 on failure."""
    if not (len(buffers) == len(peer_addresses) == len(lengths)):
        logger.error("buffers, peer addresses and lengths have different sizes")
        return -1
    deadline = clock() + timeout_s(int(sum(lengths)))
    pending = []
    failed = False
    for buf, peer, n in zip(buffers, peer_addresses, lengths):
        bid = engine.transfer_submit_write(session_id, int(buf), int(peer), int(n))
        if bid in _BAD_IDS:
            failed = True  # the slices already submitted are still waited for: they write into the peer
            break
        pending.append(bid)
    nap = FIRST_SLEEP_S
    for bid in pending:
        while True:
            st = engine.transfer_check_status(bid)
            if st == DONE:
                break
            if st == FAILED:
                failed = True
                break
            if st == TIMEOUT or clock() > deadline:
                logger.warning("Mooncake write to %s timed out", session_id)
                return -1
            sleep(nap)
            nap = min(max_sleep_s, nap * 2)
    return -1 if failed else 0
