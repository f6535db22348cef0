"""Queue-aware WAN time: a new transfer waits for the bytes already queued ahead of it.

The bandwidth estimate (`policy.bandwidth`) predicts a transfer as if the line were idle: missed
bytes / throughput + RTT. On a congested line the bytes already queued towards MD's site are
what sets the tail. Two disciplines:

* FIFO (the serving P: one main lane per MD session set, one worker writing its chunks in order,
  `transfer.lanes`): everything queued goes first, `(b + sum(q)) / rate + RTT`.
* Fair sharing (the simulator's line, processor sharing): a new transfer of `b` bytes beside
  others with `q_i` left finishes after `b + sum(min(q_i, b))` bytes of line time.

Transfers that start later are ignored in both.
"""

from __future__ import annotations

from typing import Sequence


def finish_s(nbytes: float, queued: Sequence[float], bytes_per_s: float, rtt_s: float, fifo: bool = False) -> float:
    """Predicted time for a new transfer of `nbytes` behind `queued` bytes (per transfer ahead)."""
    if bytes_per_s <= 0:
        raise ValueError("line rate must be > 0")
    ahead = sum(max(q, 0.0) for q in queued) if fifo else sum(min(max(q, 0.0), nbytes) for q in queued)
    return (nbytes + ahead) / bytes_per_s + rtt_s
