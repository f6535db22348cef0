"""`python -m sglang_pdd.lab.sim`: the paper scenario, sweeps, sizing, calibration, plots."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from typing import Optional, Sequence

from sglang_pdd.lab.sim.bathtub import bathtub_report, run_bathtub
from sglang_pdd.lab.sim.calibration import calibrate_cli
from sglang_pdd.lab.sim.export import paper_json
from sglang_pdd.lab.sim.kv_format import DEFAULT_MODELS, kv_format_report, run_kv_format, setting_for
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.model import MODELS
from sglang_pdd.lab.sim.never_lose_run import never_lose_report, run_never_lose
from sglang_pdd.lab.sim.oscillation import oscillation_report, run_oscillation
from sglang_pdd.lab.sim.paper import PaperSetting, run_paper
from sglang_pdd.lab.sim.plots import plot_bathtub, plot_oscillation, plot_paper, plot_wan_sweep
from sglang_pdd.lab.sim.relay_regimes import relay_regimes_report, run_relay_regimes
from sglang_pdd.lab.sim.report import paper_report
from sglang_pdd.lab.sim.sizing import sizing_report
from sglang_pdd.lab.sim.trace_run import load_trace, run_trace, run_trace_regimes, trace_report
from sglang_pdd.lab.sim.trace_sizing import run_trace_sizing, trace_sizing_report
from sglang_pdd.lab.sim.wan_sweep import run_wan_sweep, wan_sweep_report
from sglang_pdd.lab.workload.generator import generate
from sglang_pdd.lab.workload.mooncake import MooncakeOptions, add_trace_options, options_from
from sglang_pdd.lab.workload.trace import write_jsonl

logger = logging.getLogger(__name__)

SCENARIOS = ("paper", "bathtub", "oscillation", "wan-sweep", "relay-variants", "trace", "never-lose", "kv-format",
             "sizing")


def _setting(args: argparse.Namespace) -> PaperSetting:
    s = PaperSetting()
    wan = replace(s.wan, bandwidth_gbps=args.wan_gbps) if args.wan_gbps else s.wan
    sla = Sla(args.ttft_sla or s.sla.ttft_s, args.tpot_sla or s.sla.tpot_s, s.sla.attainment)
    wl = replace(s.workload, duration_s=args.window) if args.window else s.workload
    if args.seed is not None:
        wl = replace(wl, seed=args.seed)
    s = replace(s, wan=wan, sla=sla, workload=wl)
    return setting_for(s, MODELS[args.model]) if args.model != s.model.name else s


def _mooncake_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> MooncakeOptions:
    try:
        return options_from(args)
    except ValueError as e:
        ap.error(str(e))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.sim", description=__doc__)
    ap.add_argument("--scenario", choices=SCENARIOS, default="paper")
    ap.add_argument("--sizing", action="store_true",
                    help="search the cheapest PDD chip mix meeting the SLA at --load (the paper workload; "
                         "--scenario sizing --trace FILE: the recommended deployment for a trace)")
    ap.add_argument("--load", type=float, default=None,
                    help="offered req/s for --sizing; --scenario kv-format: the probe load (default 4)")
    ap.add_argument("--calibrate", metavar="REPORT.json",
                    help="compare a measured testbed report with the simulator (see docs/sim.md)")
    ap.add_argument("--trace", metavar="TRACE.jsonl",
                    help="workload trace for --scenario trace, never-lose, sizing and --calibrate: our JSONL, or the "
                         "Mooncake format (timestamp, input_length, output_length, hash_ids), "
                         "recognised by its fields")
    ap.add_argument("--systems", default="same-dc-pd,xdc-pd-drc,pdd-adaptive,pdd-bw",
                    help="comma-separated systems for --scenario trace (paper deployments; "
                         "default: %(default)s)")
    mc = ap.add_argument_group("Mooncake-format traces (--scenario trace)")
    add_trace_options(mc)
    ap.add_argument("--no-goodput", action="store_true",
                    help="--scenario trace: skip the goodput search (default: search)")
    ap.add_argument("--wan-regimes", action="store_true",
                    help="--scenario trace: run on the four WAN regimes of relay-variants "
                         "(default: the one line of --wan-gbps)")
    ap.add_argument("--seeds", default=None,
                    help="--scenario never-lose and kv-format: comma-separated seeds (workload and line "
                         "jitter on the paper workload; line jitter on a --trace) (default: 0,1,2 for "
                         "never-lose, 0 for kv-format)")
    ap.add_argument("--relay", choices=("pool", "mixed", "partition", "dedicated"), default="pool",
                    help="--scenario never-lose: the relay on P sharing its KV pool, decoding in P's own "
                         "batches, and an elastic relay pool billed while up when P has no spare capacity "
                         "(pool, default); the relay on P only (mixed) or on an SM partition of P "
                         "(partition); or the paper's RLD pool of its own, billed (dedicated) (docs/sim.md §9)")
    ap.add_argument("--export-trace", metavar="TRACE.jsonl",
                    help="write the paper-scale workload (at --load req/s) as a JSONL trace and exit")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots (needs matplotlib)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--model", choices=sorted(MODELS), default=PaperSetting().model.name,
                    help="the served model (sim/model.py; default %(default)s); a model larger than the "
                         "paper's runs on wider instances (16 x A for deepseek-v3)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="--scenario kv-format: the models compared (default: %(default)s)")
    ap.add_argument("--wan-gbps", type=float, default=None)
    ap.add_argument("--ttft-sla", type=float, default=None)
    ap.add_argument("--tpot-sla", type=float, default=None)
    ap.add_argument("--window", type=float, default=None, help="workload window, s")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    s = _setting(args)
    t0 = time.time()
    if args.calibrate:
        return calibrate_cli(args.calibrate, args.trace, s)
    if args.export_trace:
        wl = replace(s.workload, request_rate=args.load or s.workload.request_rate)
        reqs = generate(wl)
        write_jsonl(reqs, args.export_trace)
        print(f"wrote {len(reqs)} requests to {args.export_trace}")
        return 0
    try:
        seeds = [int(x) for x in (args.seeds or ("0" if args.scenario == "kv-format" else "0,1,2")).split(",")]
    except ValueError:
        ap.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if args.scenario == "never-lose":
        tr = load_trace(args.trace, _mooncake_options(ap, args)) if args.trace else None
        load = "the trace's own rate" if tr else "16 req/s"
        print((tr.description + "\n") if tr else "", end="")
        print(never_lose_report(run_never_lose(s, seeds, tr, relay=args.relay), load))
    elif args.scenario == "kv-format":
        names = args.models.split(",")
        if unknown := [n for n in names if n not in MODELS]:
            ap.error(f"--models: unknown {unknown}; known: {sorted(MODELS)}")
        tr = load_trace(args.trace, _mooncake_options(ap, args)) if args.trace else None
        load = args.load or 4.0
        print(kv_format_report(run_kv_format(s, names, seeds, tr, probe_rate=load),
                               "the trace's own rate" if tr else f"{load:g} req/s"))
    elif args.scenario == "trace":
        if not args.trace:
            ap.error("--scenario trace needs --trace TRACE.jsonl")
        tr = load_trace(args.trace, _mooncake_options(ap, args))
        systems = args.systems.split(",")
        if args.wan_regimes:
            print(run_trace_regimes(s, tr, systems, goodput=not args.no_goodput))
        else:
            print(trace_report(tr, run_trace(s, tr, systems, goodput=not args.no_goodput)))
    elif args.scenario == "sizing" and args.trace:
        tr = load_trace(args.trace, _mooncake_options(ap, args))
        print(trace_sizing_report(tr, s, run_trace_sizing(s, tr)))
    elif args.sizing or args.scenario == "sizing":
        print(sizing_report(s, args.load))
    elif args.scenario == "paper":
        res = run_paper(s)
        print(paper_report(res))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(paper_json(res), f, indent=1)
        if args.plots:
            plot_paper(res, args.plots)
    elif args.scenario == "bathtub":
        res = run_bathtub(s)
        print(bathtub_report(res))
        if args.plots:
            plot_bathtub(res, args.plots)
    elif args.scenario == "oscillation":
        res = run_oscillation(s)
        print(oscillation_report(res))
        if args.plots:
            plot_oscillation(res, args.plots)
    elif args.scenario == "wan-sweep":
        res = run_wan_sweep(s)
        print(wan_sweep_report(res))
        if args.plots:
            plot_wan_sweep(res, args.plots)
    elif args.scenario == "relay-variants":
        print(relay_regimes_report(run_relay_regimes(s)))
    print(f"\n(total wall time {time.time() - t0:.1f} s)", file=sys.stderr)
    return 0
