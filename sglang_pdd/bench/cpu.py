"""CPU time of server processes (user + system, all threads), read from /proc.

On a 2-core box the servers of both "datacenters" share the cores, so a server that burns CPU
while its KV crosses the WAN slows the others down; the report carries each server's CPU seconds
over the measured window to make that visible.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

logger = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu(stat: str) -> float:
    """utime + stime of a /proc/<pid>/stat line, in clock ticks (fields 14 and 15)."""
    fields = stat.rsplit(")", 1)[1].split()
    return float(fields[11]) + float(fields[12])


def cpu_seconds(pids: Iterable[int]) -> float:
    """Total CPU seconds used so far by the live processes `pids` (vanished ones count 0)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += parse_stat_cpu(f.read())
        except (OSError, IndexError, ValueError):
            continue
    return total / _TICKS


def snapshot(servers) -> dict[str, float]:
    """Server name -> CPU seconds of its whole process group (scheduler, detokenizer included)."""
    return {s.name: cpu_seconds(s.group_pids()) for s in servers}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}
