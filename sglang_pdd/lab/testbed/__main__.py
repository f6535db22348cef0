"""CLI: `python -m sglang_pdd.lab.testbed up|down|probe|bytes`.

    python -m sglang_pdd.lab.testbed up --prefix pdd --delay-ms 20 --rate-mbit 100
    ip netns exec pddB <server on 10.77.0.2>;  ip netns exec pddA <client>
    python -m sglang_pdd.lab.testbed probe --prefix pdd      # configured vs measured
    python -m sglang_pdd.lab.testbed down --prefix pdd
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .config import BACKENDS
from .probe import ProbeReport
from .state import default_run_dir
from .testbed import Testbed, TestbedError


def format_report(tb: Testbed, rep: ProbeReport, nbytes: dict[str, int], rtt_n: int = 20) -> str:
    """The probe as a small table, configured beside measured."""
    cfg = tb.config
    rate = f"{cfg.rate_mbit:.1f}" if cfg.shaped else "unlimited"
    jit = f" +-{2 * cfg.jitter_ms:g}" if cfg.jitter_ms else ""

    def mbit(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [
        f"testbed {tb.prefix}: {tb.ns('A').name} {tb.addr('A')} <-> {tb.ns('B').name} {tb.addr('B')}, "
        f"backend {tb.backend or '?'}" + (f", loss {cfg.loss_pct:g} %" if cfg.loss_pct else ""),
        f"{'':16}{'configured':>12}{'measured':>12}{'steady':>10}",
        f"{'RTT (ms)':16}{f'{cfg.rtt_ms:g}{jit}':>12}{rep.rtt_ms_p50:>12.2f}{'':>10}"
        f"   p50 of {rtt_n} TCP echoes; min {rep.rtt_ms_min:.2f}, max {rep.rtt_ms_max:.2f}",
        f"{'A->B (Mbit/s)':16}{rate:>12}{mbit(rep.a_to_b_mbit):>12}{mbit(rep.a_to_b_mbit_steady):>10}"
        f"   {rep.bulk_bytes / 1e6:.1f} MB bulk: first to last byte; second half",
        f"{'B->A (Mbit/s)':16}{rate:>12}{mbit(rep.b_to_a_mbit):>12}{mbit(rep.b_to_a_mbit_steady):>10}",
        f"{'link bytes':16}A->B {nbytes['A->B'] / 1e6:.2f} MB, B->A {nbytes['B->A'] / 1e6:.2f} MB (since up)",
    ]
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testbed", description="two-cluster WAN testbed")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--prefix", default="pdd", help="namespaces are <prefix>A and <prefix>B")
        sp.add_argument("--run-dir", default=None, help=f"state directory (default {default_run_dir()})")

    up = sub.add_parser("up", help="build (or keep, if identical) the testbed")
    common(up)
    up.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay")
    up.add_argument("--jitter-ms", type=float, default=0.0, help="+- uniform jitter per packet")
    up.add_argument("--rate-mbit", type=float, default=100.0, help="per direction; 0 = unlimited")
    up.add_argument("--loss-pct", type=float, default=0.0)
    up.add_argument("--backend", choices=BACKENDS, default="auto")
    up.add_argument("--subnet", default="10.77.0.0/30")
    down = sub.add_parser("down", help="stop its daemons, delete its namespaces")
    common(down)
    probe = sub.add_parser("probe", help="measure RTT and throughput, print beside the configuration")
    common(probe)
    probe.add_argument("--rtt-count", type=int, default=20)
    probe.add_argument("--bulk-mb", type=float, default=None, help="bulk size (default ~1.5 s of line rate)")
    probe.add_argument("--json", action="store_true")
    nb = sub.add_parser("bytes", help="print the link's byte counters as JSON")
    common(nb)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "up":
            tb = Testbed(args.prefix, args.delay_ms, args.jitter_ms, args.rate_mbit or None, args.loss_pct,
                         args.backend, args.subnet, args.run_dir).up()
            print(f"up: {tb.ns('A').name} {tb.addr('A')} <-> {tb.ns('B').name} {tb.addr('B')}, "
                  f"{tb.config.describe()}, backend {tb.backend}")
            return 0
        tb = Testbed.from_state(args.prefix, args.run_dir)
        if args.cmd == "down":
            tb.down()
            print(f"down: {args.prefix}")
            return 0
        if not tb.is_up():
            print(f"testbed {args.prefix} is not up (python -m sglang_pdd.lab.testbed up --prefix {args.prefix})",
                  file=sys.stderr)
            return 1
        if args.cmd == "bytes":
            print(json.dumps(tb.link_bytes()))
            return 0
        bulk = None if args.bulk_mb is None else int(args.bulk_mb * 1e6)
        rep = tb.probe(rtt_count=args.rtt_count, bulk_bytes=bulk)
        if args.json:
            print(json.dumps({"config": tb.config.to_json(), "backend": tb.backend, "measured": rep.to_json(),
                              "link_bytes": tb.link_bytes()}))
        else:
            print(format_report(tb, rep, tb.link_bytes(), args.rtt_count))
        return 0
    except (TestbedError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
