"""CPU time of the benchmark's processes, per process and per thread, read from /proc.

On a 2-core box the servers of both "datacenters" share the cores, so a server that burns CPU
while its KV crosses the WAN slows the others down; the report carries, over the measured window,
each process group's CPU seconds (servers, the router, the delay daemons, the bench's client) and
its busiest threads by name (`/proc/<pid>/task/<tid>/comm`; servers started by the bench name their
Python threads, sglang_pdd.server.thread_names), so every run shows whether the box was the bottleneck.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterable, Mapping

logger = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
TOP_THREADS = 6  # threads listed per group (the rest are summed as "other")


def parse_stat_cpu(stat: str) -> float:
    """utime + stime of a /proc/<pid>/stat line, in clock ticks (fields 14 and 15)."""
    fields = stat.rsplit(")", 1)[1].split()
    return float(fields[11]) + float(fields[12])


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_seconds(pids: Iterable[int]) -> float:
    """Total CPU seconds used so far by the live processes `pids` (vanished ones count 0)."""
    total = 0.0
    for pid in pids:
        text = _read(f"/proc/{pid}/stat")
        try:
            total += parse_stat_cpu(text) if text else 0.0
        except (IndexError, ValueError):
            continue
    return total / _TICKS


@dataclass(frozen=True)
class ThreadKey:
    pid: int
    tid: int
    name: str  # process comm / thread comm, "main" for the process's first thread


def thread_seconds(pids: Iterable[int]) -> dict[ThreadKey, float]:
    """CPU seconds so far of every live thread of the processes `pids`."""
    out: dict[ThreadKey, float] = {}
    for pid in pids:
        proc = (_read(f"/proc/{pid}/comm") or "?").strip()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tids:
            stat = _read(f"/proc/{pid}/task/{t}/stat")
            if not stat:
                continue
            try:
                secs = parse_stat_cpu(stat) / _TICKS
            except (IndexError, ValueError):
                continue
            tname = "main" if int(t) == pid else (_read(f"/proc/{pid}/task/{t}/comm") or "?").strip()
            out[ThreadKey(pid, int(t), f"{proc}/{tname}")] = secs
    return out


@dataclass
class Snapshot:
    totals: dict[str, float]  # group -> CPU seconds of its processes (exited threads included)
    threads: dict[str, dict[ThreadKey, float]]


def take(groups: Mapping[str, Iterable[int]]) -> Snapshot:
    """Group name -> pids (a server's process group, a daemon, this process)."""
    groups = {k: list(v) for k, v in groups.items()}
    return Snapshot({k: cpu_seconds(p) for k, p in groups.items()},
                    {k: thread_seconds(p) for k, p in groups.items()})


def window(after: Snapshot, before: Snapshot, top: int = TOP_THREADS) -> dict[str, dict]:
    """Per group over the window: `cpu_s` and its busiest threads, thread names merged (a name that
    several threads share, e.g. a worker pool, is summed), as {name: seconds}, the rest as "other"."""
    out = {}
    for g, total in after.totals.items():
        t0 = before.threads.get(g, {})
        by_name: dict[str, float] = {}
        for key, secs in after.threads.get(g, {}).items():
            d = secs - t0.get(key, 0.0)
            if d > 0:
                by_name[key.name] = by_name.get(key.name, 0.0) + d
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
        threads = {n: round(s, 2) for n, s in ranked[:top]}
        rest = sum(s for _, s in ranked[top:])
        cpu_s = round(total - before.totals.get(g, 0.0), 2)
        exited = cpu_s - sum(by_name.values())  # threads gone before the window's end still count
        if rest + max(exited, 0.0) >= 0.01:
            threads["other"] = round(rest + max(exited, 0.0), 2)
        out[g] = {"cpu_s": cpu_s, "threads": threads}
    return out


def snapshot(servers) -> dict[str, float]:
    """Server name -> CPU seconds of its whole process group (scheduler, detokenizer included)."""
    return {s.name: cpu_seconds(s.group_pids()) for s in servers}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


def markdown(per_system: Mapping[str, Mapping[str, dict]], wall_s: Mapping[str, float]) -> list[str]:
    """The report's CPU section: per system and group, CPU seconds, share of the window's wall time,
    and the busiest threads."""
    if not per_system:
        return []
    lines = ["## CPU over the measured window", "",
             "CPU seconds per process group (all its processes and threads; `x` = cores busy on average "
             "over the window) and its busiest threads (`process/thread`; `main` is the process's first "
             "thread: sglang's scheduler loop in a scheduler process).", "",
             "| system | group | CPU-s | cores | busiest threads (CPU-s) |", "|---|---|---|---|---|"]
    for system, groups in per_system.items():
        wall = wall_s.get(system) or 0.0
        total = sum(g["cpu_s"] for g in groups.values())
        for name, g in groups.items():
            cores = f"{g['cpu_s'] / wall:.2f}x" if wall > 0 else "n/a"
            threads = ", ".join(f"{n} {s:.1f}" for n, s in g["threads"].items())
            lines.append(f"| {system} | {name} | {g['cpu_s']:.1f} | {cores} | {threads} |")
        if wall > 0:
            lines.append(f"| {system} | **all** | {total:.1f} | {total / wall:.2f}x of {os.cpu_count()} | "
                         f"window {wall:.1f} s |")
    return lines + [""]
