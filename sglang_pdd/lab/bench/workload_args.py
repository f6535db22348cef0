"""The bench's command-line options for what is replayed (`--trace` and its `--trace-*` options, the
simulator's names) and where (`--base-url` and its `--api*` options), checked at start-up: an option
that does not apply is refused with a message naming it."""

from __future__ import annotations

import argparse

from sglang_pdd.lab.bench.live import APIS, LiveTarget
from sglang_pdd.lab.bench.presets import Preset, with_sla, with_trace
from sglang_pdd.lab.bench.trace_workload import TraceSlice
from sglang_pdd.lab.workload.mooncake import add_trace_options, options_from

# option -> its argparse default, for "given without --trace/--base-url"
TRACE_OPTIONS = {"trace_from": 0.0, "trace_to": float("inf"), "trace_speedup": 1.0, "trace_length_scale": 1.0,
                 "trace_max_context": None, "trace_requests": None, "trace_max_output": None}
LIVE_OPTIONS = {"api": "native", "api_key": None, "model": None, "metrics_url": None}
TESTBED_ONLY = ("systems", "repeat", "baseline", "placement", "export_trace", "idle_wait_ms", "transfer_poll_ms",
                "prefill_threads", "decode_threads", "omp_wait_policy", "prefix", "artifacts")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    tr = ap.add_argument_group("a recorded trace instead of the preset's workload (--trace)")
    tr.add_argument("--trace", metavar="FILE", help="replay this trace (.jsonl, .jsonl.xz, .jsonl.gz): Mooncake's "
                    "format (timestamp, input_length, output_length, hash_ids; recognised by its fields), open "
                    "loop at its timestamps, or a benchmark trace (--export-trace); the preset then gives the "
                    "link, the SLA and the timeout only (default: no trace, the preset's workload)")
    add_trace_options(tr)
    tr.add_argument("--trace-requests", type=int, default=None,
                    help="keep the first N records of the window (default: all)")
    tr.add_argument("--trace-max-output", type=int, default=None,
                    help="cap each request's scaled output tokens (default: no cap)")
    lv = ap.add_argument_group("a running deployment instead of the testbed (--base-url)")
    lv.add_argument("--base-url", metavar="URL", help="send the workload to this router or sglang server "
                    "(e.g. http://host:30000) and report on it; no testbed, no root needed (default: the testbed)")
    lv.add_argument("--api", choices=APIS, default="native", help="native: /generate with input_ids; openai: "
                    "/v1/completions with a token-id prompt (default: native)")
    lv.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default: none)")
    lv.add_argument("--model", default=None, help="--api openai: the request's model (default: the first of the "
                    "server's /v1/models)")
    lv.add_argument("--metrics-url", default=None, help="comma-separated /metrics URLs of the prefill servers, to "
                    "count the KV bytes they moved (default: the --base-url server's own, if it has the counter)")
    ap.add_argument("--ttft-sla", type=float, default=None, help="TTFT target, s (default: the preset's)")
    ap.add_argument("--tpot-sla", type=float, default=None, help="TPOT target, s (default: the preset's)")


def _given(args: argparse.Namespace, defaults: dict) -> list[str]:
    return [flag(k) for k, d in defaults.items() if getattr(args, k) != d]


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Raise ValueError naming the flag for an option that does not apply."""
    if args.trace is None and (extra := _given(args, TRACE_OPTIONS)):
        raise ValueError(f"{', '.join(extra)} need --trace FILE")
    if args.base_url is None and (extra := _given(args, LIVE_OPTIONS)):
        raise ValueError(f"{', '.join(extra)} need --base-url URL")
    if args.base_url is not None:
        bad = [flag(k) for k in TESTBED_ONLY if getattr(args, k) != ap.get_default(k)]
        if bad:
            raise ValueError(f"{', '.join(bad)} apply to the testbed, not to --base-url")


def preset_for(args: argparse.Namespace, preset: Preset) -> Preset:
    """The preset with --trace and the SLA options applied (ValueError naming the flag)."""
    if args.trace is not None:
        opts = options_from(args)
        ts = TraceSlice(args.trace, opts, args.trace_requests, args.trace_max_output)
        preset = with_trace(preset, ts)
        try:
            ts.describe()  # reads it now: a bad file or an empty slice is refused before anything starts
        except OSError as e:
            raise ValueError(f"--trace {args.trace}: {e}") from None
    return with_sla(preset, args.ttft_sla, args.tpot_sla)


def live_target(args: argparse.Namespace) -> LiveTarget:
    urls = [u.strip() for u in (args.metrics_url or "").split(",") if u.strip()]
    return LiveTarget(args.base_url, args.api, args.api_key, args.model, urls)
