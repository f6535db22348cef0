"""The demo: two datacenters on one box, an emulated WAN between them, PDD against the PD baselines.

    python -m sglang_pdd.demo [--systems same-dc,cross-dc-drc,pdd,pdd-packed] [--preset smoke]

Cluster A and cluster B are network namespaces joined by a 100 Mbit/s, 20 ms link
(`sglang_pdd.testbed`). Each system runs real sglang servers on the tiny model and serves the same
agentic multi-turn trace (each turn resends the conversation plus new text):

* `same-dc`       prefill and decode both in A (the lower bound: no WAN at all);
* `cross-dc-drc`  decode in B with upstream's decode radix cache (only missed KV crosses the WAN);
* `pdd`           P + RelayDecode + PDD router in A, MainDecode (radix cache) in B.

It prints TTFT percentiles, TPOT, SLA goodput and WAN bytes per request, and writes the full report
and plots (see docs/bench.md). Needs root (network namespaces); about 4-5 minutes on 2 cores.
"""

from __future__ import annotations

import sys
import time

from sglang_pdd.bench.__main__ import main as bench_main

DEFAULT_SYSTEMS = "same-dc,cross-dc-drc,pdd,pdd-packed"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--systems" or a.startswith("--systems=") for a in argv):
        argv = ["--systems", DEFAULT_SYSTEMS] + argv
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"]
    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
