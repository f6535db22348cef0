"""Handoff microbenchmark (docs/handoff.md): hand k eager tokens from RLD (cluster A) to MD (cluster B) over
the emulated WAN, as token IDs plus a local recompute, or as their KV.

    python -m sglang_pdd.lab.micro.handoff_micro [--tokens 100 --rounds 30 --warmup 3 --delay-ms 20
        --jitter-ms 5 --rate-mbit 100 --prefix-tokens 2000 --scenarios plain,bulk --json report.json]

Needs root (the testbed), Mooncake (non-CUDA wheel) and transformers. Real pieces, no mocks: the
`Testbed` link, the project's token channel (`RelayChannel` in A, `MainChannel` in B, HMAC'd msgspec
frames), Mooncake TCP engines in both namespaces, `pack_kv`/`unpack_kv`, and the tiny Llama for the
recompute. The two ends run as processes in their namespaces (`handoff_peers`); every latency is
measured on MD's clock, from MD sending `Ready(room)`:

  ids        Ready -> Tokens(ids) arrives (transfer), then one extend forward of the k tokens over a
             cached prefix of --prefix-tokens (recompute: sglang's ModelRunner, or
             transformers with --recompute transformers); total = transfer + recompute
  kv_paged   Ready -> RLD writes the k tokens' KV as layers x 2 x k slices (sglang at page size 1)
             -> Tokens arrives; the KV is then already in MD's pool
  kv_packed  the same as one packed slice; + pack on RLD (inside the transfer) and unpack on MD

Scenarios: `plain` (the configured delay and jitter) and `bulk` (plus a competing bulk TCP flow A->B
on the same link for the whole scenario: the paper's "queuing"). Per path: payload bytes (the
application's bytes; also the link's byte counters per handoff in the plain scenario), latency mean,
p50, max, std over the rounds (warm-up rounds excluded), and ratios against kv_packed (the faster KV
path) in the same run. kv_paged gets fewer rounds (--paged-rounds): over Mooncake TCP each of its
small slices costs about a quarter of a round trip, so one handoff takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sglang_pdd.lab.micro.handoff_peers import PATHS, Setup
from sglang_pdd.protocol import messages
from sglang_pdd.protocol.auth import MAC_LEN
from sglang_pdd.lab.testbed import Testbed, probe
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build_cached

logger = logging.getLogger(__name__)

REFERENCE_PATH = "kv_packed"  # the fastest KV path: ratios are against it
SCENARIOS = ("plain", "bulk")
# docs/handoff.md, 100 tokens: KV over the WAN vs token IDs + recompute (ms; bytes).
PAPER = {
    "kv": {"payload_kb": 4649, "mean_ms": 185.0, "max_ms": 512.6, "memcpy_ms": 24.5},
    "ids": {"payload_kb": 1.5, "mean_ms": 305.0, "max_ms": 321.4, "std_ms": 4.8},
}


@dataclass(frozen=True)
class LatencyStats:
    n: int
    mean_ms: float
    p50_ms: float
    max_ms: float
    min_ms: float
    std_ms: float  # sample standard deviation (0 for one round)

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        if not seconds:
            raise ValueError("no rounds to summarize")
        ms = [s * 1e3 for s in seconds]
        return cls(len(ms), statistics.fmean(ms), statistics.median(ms), max(ms), min(ms),
                   statistics.stdev(ms) if len(ms) > 1 else 0.0)


def tokens_frame_bytes(ids: Sequence[int], room: int) -> int:
    """Bytes of one sealed `Tokens` frame on the token channel (HMAC + msgpack), ZMQ framing excluded."""
    return MAC_LEN + len(messages.encode(messages.Tokens(room=room, ids=list(ids))))


def ready_frame_bytes(room: int) -> int:
    return MAC_LEN + len(messages.encode(messages.Ready(room=room)))


def kv_bytes(setup: Setup) -> int:
    """The k tokens' KV: every layer's K and V rows (what the paged path writes)."""
    return 2 * setup.layers * setup.tokens * setup.slot_bytes


def payload_bytes(path: str, setup: Setup, ids: Sequence[int], room: int, packed_bytes: int) -> dict[str, int]:
    """Application bytes of one handoff on `path`: A->B (data) and B->A (the Ready frame)."""
    frame = tokens_frame_bytes(ids, room)
    data = {"ids": frame, "kv_paged": kv_bytes(setup) + frame, "kv_packed": packed_bytes + frame}[path]
    return {"A->B": data, "B->A": ready_frame_bytes(room)}


def wire_bytes_per_handoff(before: dict[str, int], after: dict[str, int], handoffs: int) -> dict[str, float]:
    """The link's byte counters (L2, both directions) over a block of `handoffs` handoffs, per handoff."""
    if handoffs <= 0:
        raise ValueError("handoffs must be positive")
    return {k: (after[k] - before[k]) / handoffs for k in before}


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(rounds: list[dict[str, float]], rld: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per-component stats of one block: MD's transfer/local/total, plus RLD's pack/write if present."""
    out = {k: asdict(LatencyStats.of([r[k] for r in rounds])) for k in ("transfer_s", "local_s", "total_s")}
    for key in ("pack_s", "write_s", "build_s"):
        vals = [rld[str(r["room"])][key] for r in rounds if key in rld.get(str(r["room"]), {})]
        if vals and len(vals) == len(rounds):
            out[key] = asdict(LatencyStats.of(vals))
    return out


# --- running it ---------------------------------------------------------------------------------------


class _Peer:
    """A peer process with a thread that queues its JSON stdout lines."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put(None)

    def read(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.proc.args[-1]!r}: no answer in {timeout_s} s") from None
        if line is None:
            raise RuntimeError(f"peer exited with {self.proc.wait()}")
        return json.loads(line)

    def send(self, obj: Any) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def bulk_flow(tb: Any, flows: int = 1, seconds_per_upload: float = 2.0,
              settle_s: float = 1.5) -> Iterator[dict[str, float]]:
    """Competing bulk TCP traffic A->B while inside: `flows` connections, each back-to-back uploads to a
    probe server in B. Yields a dict that gets the flows' summed rate ("mbit") on exit."""
    rate = (tb.config.rate_mbit or 1000.0) * 1e6 / 8
    nbytes = int(rate * seconds_per_upload / flows)
    stop = threading.Event()
    per_flow = [{"bytes": 0.0, "seconds": 0.0} for _ in range(flows)]

    def loop(port: int, acc: dict[str, float]) -> None:
        while not stop.is_set():
            t = tb.ns("A").call(probe.upload, tb.addr("B"), port, nbytes, 60.0)
            acc["bytes"] += t.nbytes
            acc["seconds"] += t.seconds

    stats: dict[str, float] = {"flows": flows}
    with tb.probe_server("B") as port:
        threads = [threading.Thread(target=loop, args=(port, acc), daemon=True) for acc in per_flow]
        for th in threads:
            th.start()
        time.sleep(settle_s)  # past slow start
        try:
            yield stats
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=seconds_per_upload * 4 + 60)
    stats["mbit"] = sum(a["bytes"] * 8 / max(a["seconds"], 1e-9) / 1e6 for a in per_flow)


def _rounds(args: argparse.Namespace, path: str) -> tuple[int, int]:
    """(measured, warm-up) handoffs of one block: the paged path is seconds per handoff, so fewer."""
    if path == "kv_paged":
        return args.paged_rounds, min(args.warmup, 1)
    return args.rounds, args.warmup


def _env(secret: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, SGLANG_PDD_SECRET=secret, MC_LOG_LEVEL=os.environ.get("MC_LOG_LEVEL", "ERROR"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = TinyModelSpec()
    model_dir = build_cached(os.path.join(args.artifacts, "models"), spec)
    setup = Setup(args.tokens, args.prefix_tokens, max(4 * args.tokens, 1024), args.seed,
                  args.kv_layers or spec.layers, spec.kv_heads, spec.head_dim, spec.vocab)
    peer_argv = [sys.executable, "-m", "sglang_pdd.lab.micro.handoff_peers"]
    env = _env(secrets.token_hex(16))
    link = {"delay_ms": args.delay_ms, "jitter_ms": args.jitter_ms, "rate_mbit": args.rate_mbit}
    report: dict[str, Any] = {"setup": asdict(setup), "link": link, "model_layers": spec.layers,
                              "rounds": args.rounds, "warmup": args.warmup, "scenarios": {}}
    with Testbed(args.prefix, delay_ms=args.delay_ms, jitter_ms=args.jitter_ms, rate_mbit=args.rate_mbit) as tb:
        md = _Peer(tb.ns("B").argv([*peer_argv, "md", "--host", tb.addr("B"), "--setup", json.dumps(asdict(setup)),
                                    "--model-dir", model_dir, "--recompute", args.recompute,
                                    "--threads", str(args.threads)]), env)
        rld: _Peer | None = None
        try:
            md_info = md.read(120)
            rld = _Peer(tb.ns("A").argv([*peer_argv, "rld", "--host", tb.addr("A"), "--setup",
                                         json.dumps(asdict(setup)), "--peer", json.dumps(md_info)]), env)
            md.send({"channel": rld.read(60)["channel"]})
            report["md"] = md.read(300)
            blocks: dict[tuple[str, str], Any] = {}
            for scenario in args.scenarios:
                ctx = bulk_flow(tb, args.bulk_flows) if scenario == "bulk" else contextlib.nullcontext({})
                with ctx as bulk:
                    for path in args.paths:
                        n, warmup = _rounds(args, path)
                        if warmup:
                            md.send({"path": path, "rounds": warmup})
                            md.read(args.timeout_s)
                        before = tb.link_bytes()
                        md.send({"path": path, "rounds": n})
                        rounds = md.read(args.timeout_s)["rounds"]
                        after = tb.link_bytes()
                        blocks[(scenario, path)] = (rounds, wire_bytes_per_handoff(before, after, n))
                        logger.info("%s/%s done", scenario, path)
                report["scenarios"].setdefault(scenario, {})["bulk_flow"] = dict(bulk)
            md.send({"cmd": "quit"})
            if md.proc.wait(timeout=60) != 0:
                raise RuntimeError("MD failed its final check (see its stderr)")
            rld.send("quit")
            timings = rld.read(60)["timings"]
        finally:
            for p in (rld, md):
                if p is not None:
                    p.stop()
    _assemble(report, setup, blocks, timings, md_info["packed_bytes"])
    return report


def _assemble(report: dict[str, Any], setup: Setup, blocks: dict[tuple[str, str], Any],
              timings: dict[str, dict[str, float]], packed_bytes: int) -> None:
    """Per (scenario, path): payload, wire bytes, stats (MD's rounds + RLD's timings), ratios."""
    ids = setup.eager_ids()
    for (scenario, path), (rounds, wire) in blocks.items():
        room = rounds[0]["room"]
        report["scenarios"][scenario][path] = {
            "payload_bytes": payload_bytes(path, setup, ids, room, packed_bytes),
            "wire_bytes_per_handoff": wire, "slices": timings[str(room)].get("slices", 0),
            "stats": summarize(rounds, timings), "rounds": rounds}
    for paths in report["scenarios"].values():
        ref = paths.get(REFERENCE_PATH)
        for path, r in paths.items():
            if path == "bulk_flow" or ref is None:
                continue
            r["vs_" + REFERENCE_PATH] = {
                "payload": ratio(r["payload_bytes"]["A->B"], ref["payload_bytes"]["A->B"]),
                **{k: ratio(r["stats"]["total_s"][k + "_ms"], ref["stats"]["total_s"][k + "_ms"])
                   for k in ("mean", "p50", "max", "std")}}


# --- report -------------------------------------------------------------------------------------------

_LABELS = {"ids": "token IDs", "kv_paged": "KV paged", "kv_packed": "KV packed"}
_PARTS = {
    "ids": (("transfer_s", "  transfer Ready->Tokens"), ("local_s", "  recompute (1 extend)")),
    "kv_paged": (("build_s", "  slice list (RLD)"), ("write_s", "  Mooncake write (RLD)")),
    "kv_packed": (("pack_s", "  pack (RLD, CPU)"), ("write_s", "  Mooncake write (RLD)"),
                  ("local_s", "  unpack (MD, CPU)")),
}


def _row(label: str, s: dict[str, float], payload: str = "", wire: str = "", rel: str = "") -> str:
    return (f"{label:<26} {payload:>10} {wire:>10} {s['n']:>3} {s['mean_ms']:>8.1f} {s['p50_ms']:>8.1f} "
            f"{s['max_ms']:>8.1f} {s['std_ms']:>7.1f}  {rel}")


def _header(report: dict[str, Any]) -> list[str]:
    st, link, md = report["setup"], report["link"], report["md"]
    kib = 2 * st["layers"] * st["kv_heads"] * st["head_dim"] * 4 // 1024
    return [
        f"handoff of {st['tokens']} tokens, prefix {st['prefix_tokens']}; KV {st['layers']} layers x "
        f"{st['kv_heads']} heads x {st['head_dim']} fp32 = {kib} KiB/token (recompute: the tiny Llama, "
        f"{report['model_layers']} layers); link {link['delay_ms']:g} ms ±{link['jitter_ms']:g} ms one way, "
        f"{link['rate_mbit']:g} Mbit/s; rounds per path in column n (after {report['warmup']} warm-up)",
        f"recompute: {md['recompute_engine']}; extend vs full forward: max |Δlogit| "
        f"{md['recompute_check_max_abs_logit']:.1e}",
    ]


def _paper_line() -> str:
    kv, ids = PAPER["kv"], PAPER["ids"]
    return (f"paper (docs/handoff.md, 100 tokens, real model): KV {kv['payload_kb']} KB, mean {kv['mean_ms']} ms, "
            f"max {kv['max_ms']} ms, + {kv['memcpy_ms']} ms memcpy; token IDs {ids['payload_kb']} KB, "
            f"mean {ids['mean_ms']} ms, max {ids['max_ms']} ms, std {ids['std_ms']} ms; "
            f"IDs / KV: mean {ids['mean_ms'] / kv['mean_ms']:.3g}, max {ids['max_ms'] / kv['max_ms']:.3g}")


def format_report(report: dict[str, Any]) -> str:
    lines = _header(report)
    for scenario, paths in report["scenarios"].items():
        bulk = paths.get("bulk_flow") or {}
        extra = (f" (competing bulk traffic A->B: {bulk.get('flows', 1):g} TCP flow(s), {bulk['mbit']:.1f} Mbit/s)"
                 if bulk.get("mbit") else "")
        lines += ["", f"scenario {scenario}{extra}",
                  f"{'path':<26} {'payload B':>10} {'wire B':>10} {'n':>3} {'mean ms':>8} {'p50 ms':>8} "
                  f"{'max ms':>8} {'std ms':>7}  x {_LABELS[REFERENCE_PATH]} (payload / mean / max / std)"]
        for path, r in paths.items():
            if path == "bulk_flow":
                continue
            rel = r.get("vs_" + REFERENCE_PATH, {}) if path != REFERENCE_PATH else {}
            rel_s = " / ".join("-" if rel.get(k) is None else f"{rel[k]:.3g}"
                               for k in ("payload", "mean", "max", "std"))
            wire = f"{r['wire_bytes_per_handoff']['A->B']:.0f}" if scenario == "plain" else ""
            lines.append(_row(_LABELS[path] + " total", r["stats"]["total_s"], str(r["payload_bytes"]["A->B"]),
                              wire, rel_s if rel else ""))
            for key, label in _PARTS[path]:
                if key in r["stats"]:
                    lines.append(_row(label, r["stats"][key]))
    return "\n".join([*lines, "", _paper_line()])


def _csv(choices: Sequence[str]):
    def parse(text: str) -> list[str]:
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}")
        return items
    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100, help="eager tokens handed over")
    ap.add_argument("--rounds", type=int, default=30, help="measured handoffs per path and scenario")
    ap.add_argument("--paged-rounds", type=int, default=5,
                    help="measured handoffs of kv_paged (seconds each over Mooncake TCP; 1 warm-up at most)")
    ap.add_argument("--warmup", type=int, default=3, help="handoffs before each measured block (not counted)")
    ap.add_argument("--prefix-tokens", type=int, default=2000, help="MD's cached prefix the recompute attends to")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay")
    ap.add_argument("--jitter-ms", type=float, default=5.0)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--scenarios", type=_csv(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--bulk-flows", type=int, default=1, help="competing TCP connections in the bulk scenario")
    ap.add_argument("--paths", type=_csv(PATHS), default=list(PATHS))
    ap.add_argument("--kv-layers", type=int, default=0,
                    help="layers of the KV the KV paths ship (default: the model's); 12 ~ the paper's 4649 KB")
    ap.add_argument("--recompute", choices=["sglang", "transformers"], default="sglang",
                    help="MD's recompute engine: sglang's ModelRunner in-process, or transformers")
    ap.add_argument("--threads", type=int, default=0, help="MD's torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default="pdhm", help="testbed namespace prefix")
    ap.add_argument("--artifacts", default=os.environ.get("SGLANG_PDD_ARTIFACTS", ".artifacts"),
                    help="where the tiny model is built (cached)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per block of rounds")
    ap.add_argument("--json", help="write the full report (every round) here")
    args = ap.parse_args(argv)
    report = run(args)
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    sys.exit(main())
