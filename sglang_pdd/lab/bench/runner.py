"""One benchmark run: build the model, bring the testbed up, and for each system in turn start its
servers, warm up, replay the same trace, read the WAN and KV byte counters, stop.

WAN bytes of a system = the testbed's link counters (both directions, on the wire) over the
measured window only; KV bytes = the delta of P's `sglang_pdd_transfer_bytes_total{kind="kv"}`
over the same window (what Mooncake moved, whichever link it took).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

from sglang_pdd.lab.bench import cpu
from sglang_pdd.lab.bench import placement as place
from sglang_pdd.lab.bench.metrics import RequestRecord, Summary, WanBytes, summarize
from sglang_pdd.lab.bench.presets import Preset
from sglang_pdd.lab.bench.replay import progress_bar, replay, warm_up
from sglang_pdd.lab.bench.systems import Deployment, make_system
from sglang_pdd.lab.testbed import Testbed
from sglang_pdd.lab.testbed.bulk_flow import BulkFlow
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build_cached
from sglang_pdd.lab.workload.generator import measured
from sglang_pdd.lab.workload.request import WorkloadRequest
from sglang_pdd.lab.workload.trace import write_jsonl
from sglang_pdd.policy import kv_bytes

logger = logging.getLogger(__name__)


@dataclass
class SystemRun:
    name: str
    sim_name: str
    description: str
    summary: Summary | None
    records: list[RequestRecord] = field(default_factory=list)
    wan: WanBytes = field(default_factory=WanBytes)
    startup_s: float = 0.0
    warmup_failed: int = 0
    error: str = ""
    log_dir: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)  # per server, over the measured window
    cpu: dict[str, dict] = field(default_factory=dict)  # per process group: cpu_s and busiest threads
    repeat: int = 0  # which of --repeat's rounds (0-based)
    label: str = ""  # unique within the run: the name, with "-r<k>" when there are several repeats
    background: dict = field(default_factory=dict)  # the bulk flow sharing the link, if the preset has one


@dataclass
class BenchRun:
    preset: Preset
    trace_path: str
    model_dir: str
    model_info: dict
    systems: list[SystemRun]
    runtime_s: float
    testbed: dict = field(default_factory=dict)
    repeats: int = 1
    baseline: str | None = None
    server_flags: tuple[str, ...] = ()  # given to every sglang server of every system
    placement: dict = field(default_factory=dict)  # bench.placement.describe()
    client: str = ""  # where the client ran and what it sent; empty: the testbed's client (report.py)


def model_info(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "sglang_pdd_tiny_model.json")) as f:
        return json.load(f)


def _delta(after: dict[str, int], before: dict[str, int]) -> tuple[int, int]:
    return after["A->B"] - before["A->B"], after["B->A"] - before["B->A"]


def _cpu_groups(system, tb, flow: BulkFlow | None = None) -> dict[str, list[int]]:
    groups = {s.name: s.group_pids() for s in system.servers()}
    for side, pid in getattr(tb, "daemon_pids", lambda: {})().items():
        groups[f"delay daemon {side}"] = [pid]
    if flow is not None:
        groups["background flow"] = flow.pids()
    groups["bench (client)"] = [os.getpid()]
    return groups


def _link_and_flow(tb, flow: BulkFlow | None) -> tuple[dict[str, int], dict[str, float] | None]:
    """The link counters and, if a background flow runs, its own count at the same moment: the mean of
    a read just before and one just after (the flow keeps sending while its rules are read)."""
    if flow is None:
        return tb.link_bytes(), None
    before = flow.wire_bytes()
    link = tb.link_bytes()
    after = flow.wire_bytes()
    return link, {k: (before[k] + after[k]) / 2 for k in after}


def run_system(name: str, tb, model_dir: str, reqs: list[WorkloadRequest], preset: Preset,
               vocab_size: int, log_root: str, show_progress: bool = True,
               kv_bytes_per_token: int | None = None, repeat: int = 0, repeats: int = 1,
               server_flags: tuple[str, ...] = (), cpus: dict | None = None,
               threads: dict | None = None) -> SystemRun:
    system = make_system(name)
    label = name if repeats == 1 else f"{name}-r{repeat + 1}"
    run = SystemRun(name, system.sim_name, system.description, None, log_dir=os.path.join(log_root, label),
                    repeat=repeat, label=label)
    client_ns = tb.ns(system.client_side)
    t0 = time.monotonic()
    flow = None
    try:
        system.start(Deployment(tb, model_dir, run.log_dir, kv_bytes_per_token, tuple(server_flags), dict(cpus or {}),
                                dict(threads or {}), ttft_slo_s=preset.sla.ttft_s))
        run.startup_s = time.monotonic() - t0
        logger.info("%s: servers up in %.1f s; %d warm-ups", name, run.startup_s,
                    sum(r.warmup for r in reqs))
        run.warmup_failed = client_ns.call(warm_up, system.send_warmup, reqs, vocab_size, preset.request_timeout_s)
        if preset.background is not None:  # the shared line's own traffic, over the whole measured window
            bg = preset.background
            flow = BulkFlow(tb, bg.src, bg.dst, bg.port, bg.pace_mbit).start()
        kv0, sl0 = client_ns.call(system.kv_bytes_sent), client_ns.call(system.kv_slices_sent)
        cpu0 = cpu.snapshot(system.servers())
        groups = _cpu_groups(system, tb, flow)
        threads0 = cpu.take(groups)
        link0, flow0 = _link_and_flow(tb, flow)
        tw0 = time.monotonic()
        bar = progress_bar(len(measured(reqs)), name, show_progress)
        run.records = client_ns.call(replay, system.send, reqs, vocab_size, preset.request_timeout_s, bar)
        link1, flow1 = _link_and_flow(tb, flow)
        if flow is not None:  # its bytes are the line's, not the system's: left out of the WAN bytes
            span = max(time.monotonic() - tw0, 1e-9)
            fb = {k: round(flow1[k] - flow0[k]) for k in flow1}
            link1 = {k: link1[k] - fb[k] for k in link1}
            run.background = {**flow.describe(), "wire_bytes": fb,
                              "mbit": {k: v * 8 / span / 1e6 for k, v in fb.items()}}
        run.cpu = cpu.window(cpu.take(groups), threads0)
        run.cpu_s = cpu.delta(cpu.snapshot(system.servers()), cpu0)
        kv1, sl1 = client_ns.call(system.kv_bytes_sent), client_ns.call(system.kv_slices_sent)
        a2b, b2a = _delta(link1, link0)
        run.wan = WanBytes(a2b, b2a, kv1 - kv0 if kv0 is not None and kv1 is not None else None,
                           sl1 - sl0 if sl0 is not None and sl1 is not None else None)
        run.summary = summarize(label, run.records, preset.sla, run.wan)
    except Exception as e:  # one system failing must not lose the others' results
        logger.exception("%s failed", name)
        run.error = f"{type(e).__name__}: {e}"
    finally:
        if flow is not None:
            flow.stop()
        system.stop()
    return run


def run_bench(systems: list[str], preset: Preset, out_dir: str, artifacts: str, prefix: str,
              show_progress: bool = True, repeats: int = 1, baseline: str | None = None,
              server_flags: tuple[str, ...] = (), placement: str = "shared",
              threads: dict | None = None, omp_wait: str = "default",
              model_spec: TinyModelSpec = TinyModelSpec()) -> BenchRun:
    t0 = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    model_dir = build_cached(os.path.join(artifacts, "models"), model_spec)
    info = model_info(model_dir)
    info["kv_bytes_per_token"] = kv_bytes.from_config(model_dir)  # as the router reads it (MLA: latent + rope)
    vocab = int(info["vocab_size"])
    if vocab < preset.workload.vocab_size:
        raise ValueError(f"workload vocabulary {preset.workload.vocab_size} exceeds the model's {vocab}")
    reqs = preset.requests()
    trace_path = os.path.join(out_dir, "trace.jsonl")
    write_jsonl(reqs, trace_path)
    logger.info("trace: %d requests (%d measured) -> %s", len(reqs), len(measured(reqs)), trace_path)
    link = preset.link
    runs = []
    with Testbed(prefix, delay_ms=link.delay_ms, jitter_ms=link.jitter_ms, rate_mbit=link.rate_mbit,
                 loss_pct=link.loss_pct) as tb:
        tb_info = {"prefix": prefix, "A": tb.addr("A"), "B": tb.addr("B"), "backend": tb.backend,
                   **asdict(link)}
        cpus = place.cpu_sets(placement)
        for r in range(repeats):  # interleaved: every system once per repeat
            for name in systems:
                runs.append(run_system(name, tb, model_dir, reqs, preset, preset.workload.vocab_size,
                                       os.path.join(out_dir, "logs"), show_progress, info["kv_bytes_per_token"],
                                       r, repeats, server_flags, cpus, threads))
    return BenchRun(preset, trace_path, model_dir, info, runs, time.monotonic() - t0, tb_info, repeats,
                    baseline, tuple(server_flags), place.describe(placement, threads=threads,
                                                                             omp_wait=omp_wait))
