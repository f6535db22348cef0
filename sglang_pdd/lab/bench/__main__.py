"""The agentic benchmark on the two-datacenter testbed.

    python -m sglang_pdd.lab.bench --systems same-dc,cross-dc,cross-dc-drc --preset smoke [--out DIR]
    python -m sglang_pdd.lab.bench --trace FILE [--trace-* ...] ...     (a recorded trace, e.g. Mooncake's)
    python -m sglang_pdd.lab.bench --base-url URL [--api native|openai] ...   (a running deployment)

Builds the tiny model (cached), brings up the emulated WAN, then for each system starts its servers,
replays the same trace (same seed), stops them. Writes report.json, report.md,
calibration-<system>.json, trace.jsonl and the plots into --out (default runs/bench-<preset>-<time>).
Needs root (network namespaces), except with --base-url (bench/live.py). See docs/bench.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from sglang_pdd.server import thread_names
from sglang_pdd.lab.bench import workload_args
from sglang_pdd.lab.bench.live import LiveServerError, run_live
from sglang_pdd.lab.bench.placement import PLACEMENTS
from sglang_pdd.lab.bench.plots import write_plots
from sglang_pdd.lab.bench.presets import PRESETS, get_preset
from sglang_pdd.lab.bench.repeats import markdown as repeats_md
from sglang_pdd.lab.bench.report import repeat_aggregate, text_table, write_reports
from sglang_pdd.lab.bench.runner import run_bench
from sglang_pdd.lab.bench.systems import parse_systems, system_names
from sglang_pdd.lab.testing import tiny_mla
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec
from sglang_pdd.lab.testbed.netns import netns_supported
from sglang_pdd.lab.workload.trace import write_jsonl

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default="same-dc,cross-dc,cross-dc-drc",
                    help=f"comma-separated, from: {', '.join(system_names())}")
    ap.add_argument("--preset", default="smoke", choices=sorted(PRESETS))
    ap.add_argument("--out", default=None, help="output directory")
    ap.add_argument("--artifacts", default=os.environ.get("SGLANG_PDD_ARTIFACTS", ".artifacts"),
                    help="model cache root (models/ below it)")
    ap.add_argument("--prefix", default=f"pb{os.getpid() % 100000}", help="testbed namespace prefix")
    ap.add_argument("--export-trace", metavar="TRACE.jsonl", help="write the preset's trace and exit")
    ap.add_argument("--repeat", type=int, default=1, help="run every system N times, interleaved (ABAB...); "
                    "the report gives medians, min-max and per-repeat ratios to --baseline")
    ap.add_argument("--baseline", default=None, help="system the ratios are against (default: cross-dc-drc if "
                    "run, else the first system)")
    ap.add_argument("--idle-wait-ms", type=float, default=5.0, help="--pdd-idle-wait-ms of every server of every "
                    "system, baselines included (0: sglang's spin); docs/idle.md")
    ap.add_argument("--transfer-poll-ms", type=float, default=1.0, help="--pdd-transfer-poll-ms of every server "
                    "(0: Mooncake's spinning sync write)")
    ap.add_argument("--placement", default="shared", choices=PLACEMENTS, help="CPU sets per datacenter "
                    "(bench/placement.py)")
    ap.add_argument("--prefill-threads", type=int, default=1, help="torch (OpenMP) threads of every prefill "
                    "server (0: torch's default, one per CPU); bench/placement.py says why 1 is the default")
    ap.add_argument("--decode-threads", type=int, default=1, help="torch threads of every decode server (the "
                    "baselines' decode, RLD and MD); 0: torch's default")
    ap.add_argument("--omp-wait-policy", default="passive", choices=("passive", "active", "default"),
                    help="OMP_WAIT_POLICY of every server of every system (passive: OpenMP workers sleep at "
                    "their barriers instead of spinning; default: leave it unset)")
    ap.add_argument("--model-arch", default="llama", choices=("llama", "mla"),
                    help="the tiny test model every system serves: llama (MHA, 16 KiB KV per token) or mla "
                         "(DeepSeek-V3 architecture, one latent per layer; served with sglang's intel_amx "
                         "attention backend on CPU)")
    workload_args.add_arguments(ap)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        workload_args.check(ap, args)
        preset = workload_args.preset_for(args, get_preset(args.preset))
        systems = parse_systems(args.systems)
    except ValueError as e:
        ap.error(str(e))
    if args.prefill_threads < 0 or args.decode_threads < 0:
        ap.error("--prefill-threads and --decode-threads must be >= 0")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    baseline = args.baseline or ("cross-dc-drc" if "cross-dc-drc" in systems else systems[0])
    if baseline not in systems:
        ap.error(f"--baseline {baseline} is not among --systems")
    server_flags = ("--pdd-idle-wait-ms", f"{args.idle_wait_ms:g}", "--pdd-transfer-poll-ms",
                    f"{args.transfer_poll_ms:g}")
    if args.model_arch == "mla":  # sglang's CPU MLA path: its attention backend, and our torch ops under it
        server_flags += ("--attention-backend", tiny_mla.ATTENTION_BACKEND)
    if args.export_trace:
        reqs = preset.requests()
        write_jsonl(reqs, args.export_trace)
        print(f"wrote {len(reqs)} requests to {args.export_trace}")
        return 0

    if args.base_url:
        return _live(args, preset)
    ok, why = netns_supported()
    if not ok:
        print(f"bench: {why} (servers run in the testbed's network namespaces)", file=sys.stderr)
        return 2

    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C: servers stopped, testbed down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or os.path.join("runs", f"bench-{preset.name}-{time.strftime('%Y%m%d-%H%M%S')}")

    os.environ[thread_names.ENV] = "1"  # servers (and this process's client threads) name their threads
    if args.omp_wait_policy != "default":  # inherited by every server of every system
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    if args.model_arch == "mla":
        os.environ.update(tiny_mla.SERVER_ENV)  # inherited by every server of every system
    thread_names.install()
    run = run_bench(systems, preset, out, args.artifacts, args.prefix, show_progress=not args.no_progress,
                    repeats=args.repeat, baseline=baseline, server_flags=server_flags, placement=args.placement,
                    threads={"prefill": args.prefill_threads, "decode": args.decode_threads},
                    omp_wait=args.omp_wait_policy, model_spec=TinyModelSpec(arch=args.model_arch))
    paths = write_reports(run, out)
    if not args.no_plots:
        paths.update(write_plots(run, out))
    print()
    print(text_table([s.summary for s in run.systems if s.summary]))
    if args.repeat > 1:
        print("\n".join(repeats_md(repeat_aggregate(run), baseline, args.repeat)))
    for s in run.systems:
        if s.error:
            print(f"{s.name} FAILED: {s.error} (logs: {s.log_dir})")
    _outputs(run, out, paths)
    return 1 if any(s.error for s in run.systems) else 0


def _outputs(run, out: str, paths: dict) -> None:
    names = ", ".join(sorted(os.path.basename(p) for p in paths.values()))
    print(f"\nruntime {run.runtime_s:.0f} s; outputs in {out}: {names}")


def _live(args, preset) -> int:
    """--base-url: the workload against a running deployment, the same report."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or os.path.join("runs", f"bench-live-{preset.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        target = workload_args.live_target(args)
        run = run_live(target, preset, out, show_progress=not args.no_progress)
    except (ValueError, LiveServerError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    paths = write_reports(run, out)
    if not args.no_plots:
        paths.update(write_plots(run, out))
    print()
    print(text_table([s.summary for s in run.systems if s.summary]))
    _outputs(run, out, paths)
    return 1 if any(not r.ok for s in run.systems for r in s.records) else 0


if __name__ == "__main__":
    sys.exit(main())
