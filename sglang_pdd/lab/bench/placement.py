"""Where the benchmark's servers run on the box's CPUs (`--placement`), recorded in the report.

* `shared` (default): no pinning; the kernel spreads every process over all CPUs.
* `per-dc`: cluster A's servers (P, RLD, the router; for the baselines prefill and the router, and
  decode in same-dc) on the first half of the CPUs, cluster B's (MD, the cross-DC decode) on the
  second half (`taskset -c`). On 2 cores: A on CPU 0, B on CPU 1.

The bench's client threads and the testbed's delay daemons are never pinned.

Why `shared` is the default: separate machines per instance cannot be had on 2 cores, and a
per-datacenter split puts P, RLD, the router and the client on one core while B's decoder idles on
the other between requests; with the idle spinning gone (--pdd-idle-wait-ms, --pdd-transfer-poll-ms),
an instance with nothing to do uses no CPU, so letting the kernel place the busy ones is the closer
approximation. `per-dc` is there to check that a verdict does not hinge on cluster A's compute
stealing from cluster B's (docs/bench.md).

Threads (`--prefill-threads`, `--decode-threads`, default 1 each) and `--omp-wait-policy` (default
passive): torch's CPU engine runs one OpenMP worker per CPU in every server, and GNU OpenMP's workers
spin at every barrier before they sleep. With three to five servers on 2 cores, every decode step of
one server then fights the other's spinning workers (the same busy waiting the idle wait removed from
the scheduler loops, one level down), and a decode step whose second worker is descheduled waits at
the barrier. One thread per server and sleeping workers is the closer approximation of one machine
per instance: each instance computes on one core and yields it when it has nothing to do. Measured
(cold preset, docs/bench.md "Threads and OpenMP waiting"): pdd's relayed TPOT went from 2.1-5.2x
cross-dc-drc's (3 repeats, torch's defaults) to 1.14-1.56x (3 repeats, median 1.29x), and both
systems used about a quarter less CPU. Every system, baselines
included, gets the same settings; the report records them.
"""

from __future__ import annotations

import os

PLACEMENTS = ("shared", "per-dc")


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_sets(placement: str, cpus: list[int] | None = None) -> dict[str, str]:
    """side -> `taskset -c` list ({} for `shared`)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose from {', '.join(PLACEMENTS)}")
    if placement == "shared":
        return {}
    cpus = list(cpus if cpus is not None else _cpus())
    if len(cpus) < 2:
        raise ValueError("--placement per-dc needs at least 2 CPUs")
    half = len(cpus) // 2
    return {"A": ",".join(map(str, cpus[:half])), "B": ",".join(map(str, cpus[half:]))}


def thread_env(n: int) -> dict[str, str]:
    """A server's environment for `n` torch (OpenMP) threads: torch's CPU engine sizes its pool from
    OMP_NUM_THREADS; without it every server runs one thread per CPU of its affinity."""
    if n < 1:
        raise ValueError(f"thread count {n} must be >= 1")
    return {"OMP_NUM_THREADS": str(n)}


def describe(placement: str, cpus: list[int] | None = None, threads: dict | None = None,
             omp_wait: str = "default") -> dict:
    """The placement as the report records it; `threads`: sglang mode -> torch threads (0: default);
    `omp_wait`: every server's OMP_WAIT_POLICY ("default": unset)."""
    sets = cpu_sets(placement, cpus)
    return {"placement": placement, "cpus": list(cpus if cpus is not None else _cpus()),
            "cpu_sets": sets or {"A": "all", "B": "all"}, "unpinned": ["bench client", "delay daemons"],
            "threads": {m: (n or "default") for m, n in sorted((threads or {}).items())},
            "omp_wait_policy": omp_wait}
