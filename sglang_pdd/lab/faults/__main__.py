"""CLI: `python -m sglang_pdd.lab.faults [--scenarios a,b] [--quick] [--json OUT]`.

Builds the tiny model (cached), brings up the WAN testbed, starts the deployment once, runs the
scenarios and prints the table (markdown), the migration counters and the migrated requests' timing.
Needs root (network namespaces) and iproute2/iptables. Exit status 1 when a scenario fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from sglang_pdd.lab.faults import report
from sglang_pdd.lab.faults.scenarios import BY_NAME, parse
from sglang_pdd.lab.faults.suite import Options, run



def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.faults", description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default="all", help=f"comma list of: {', '.join(BY_NAME)}")
    ap.add_argument("--concurrency", type=int, default=4, help="concurrent conversations per scenario")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation")
    ap.add_argument("--long-cut-s", type=float, default=None, help="wan-cut-long's cut (default 90; --quick: 15)")
    ap.add_argument("--idle-s", type=float, default=None, help="idle-then-traffic's idle (default 600; --quick: 20)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a shorter long cut and idle")
    ap.add_argument("--delay-ms", type=float, default=10.0, help="the WAN's one-way delay")
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="the WAN's rate per direction")
    ap.add_argument("--json", metavar="OUT", default=None, help="write the results as JSON")
    ap.add_argument("--artifacts", default=os.environ.get("SGLANG_PDD_ARTIFACTS", ".artifacts"),
                    help="model cache and logs")
    ap.add_argument("--prefix", default=f"pf{os.getpid() % 100000}", help="testbed namespace prefix")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def options(args) -> Options:
    """The run's options; what --long-cut-s and --idle-s leave unset --quick shortens."""
    cut, idle = (15.0, 20.0) if args.quick else (90.0, 600.0)
    return Options(args.concurrency, args.turns, long_cut_s=cut if args.long_cut_s is None else args.long_cut_s,
                   idle_s=idle if args.idle_s is None else args.idle_s)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        scenarios = parse(args.scenarios)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reports, info = run(scenarios, options(args), args.artifacts, args.prefix, args.delay_ms, args.rate_mbit)
    print(report.table(reports))
    print()
    print(report.details(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(reports, **info), f, indent=1)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
