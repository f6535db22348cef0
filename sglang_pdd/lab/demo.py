"""The demo: two datacenters on one box, an emulated WAN between them, PDD against the PD baselines.

    python -m sglang_pdd.lab.demo [--systems same-dc,cross-dc-drc,pdd] [--preset demo] [--repeat 2]

Cluster A and cluster B are network namespaces joined by a 100 Mbit/s, 20 ms link
(`sglang_pdd.lab.testbed`). Each system runs real sglang servers on the tiny model and serves the same
agentic multi-turn trace (each turn resends the conversation plus new text):

* `same-dc`       prefill and decode both in A (the lower bound: no WAN at all);
* `cross-dc-drc`  decode in B with upstream's decode radix cache (only missed KV crosses the WAN);
* `pdd`           P + RelayDecode + PDD router in A, MainDecode (radix cache) in B.

The default preset, `demo`, is cold turns (each under 5 % prefix hit: ~28 MiB of KV must cross the
WAN before a cross-DC decode can start), the requests RelayDecode exists for; each system runs twice,
interleaved, so the report gives each figure's spread and, repeat by repeat, whether PDD beat
cross-dc-drc in both. It prints TTFT percentiles, TPOT, SLA goodput and WAN bytes per request, and
writes the full report and plots (see docs/bench.md). Needs root (network namespaces); about 8
minutes on 2 cores. Any bench flag works (`--preset smoke --repeat 1`, `--systems ...,pdd-packed`).
"""

from __future__ import annotations

import sys
import time

from sglang_pdd.lab.bench.__main__ import main as bench_main

DEFAULT_SYSTEMS = "same-dc,cross-dc-drc,pdd"
DEFAULTS = {"--systems": DEFAULT_SYSTEMS, "--preset": "demo", "--repeat": "2"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for flag, value in DEFAULTS.items():
        if not any(a == flag or a.startswith(flag + "=") for a in argv):
            argv = [flag, value] + argv
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"]
    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
