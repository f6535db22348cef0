"""Benchmark presets: workload, trace size, WAN link and SLA, sized for the CPU testbed.

Scale (issue 3 item 5): the tiny Llama has 16 KiB of KV per token (`TinyModelSpec()`), prompts are
1500-2000 tokens on a session's first turn and grow turn by turn, and the WAN is 100 Mbit/s with
20 ms one way. A whole 2000-token prompt is then ~32 MiB of KV, ~2.9 s on the
wire: a full transfer takes seconds, as in the paper, while a 90 %-hit turn moves ~0.3 s worth.

* `smoke`: 4 sessions x up to 4 turns, 32 output tokens; three systems in under ~10 minutes.
* `handoff`: 6 sessions x up to 3 turns, 160 output tokens: long enough that most relayed requests
  are handed over (one-shot vs catch-up vs adaptive).
* `odd`: 6 sessions x up to 4 turns, 64 output tokens, 30 % odd traffic (8-24 tokens) and 30 % of
  turns under 50 % hit: what the odd-traffic filter is for.
* `paper`: 8 sessions x up to 6 turns, 64 output tokens, the default hit histogram with its
  odd-traffic share; ~3x longer.
* `cold`: 4 sessions x 2 turns, 16 output tokens, every turn under 5 % hit: nearly the whole KV
  crosses the WAN each time (what the packed WAN path is for; TTFT is then mostly the transfer).
* `demo`: the cold preset's first 3 sessions (6 turns): the README demo's preset, sized so that
  three systems twice over fit in about 8 minutes with a verdict that does not flip.
* `congested`: the paper's agentic mix (6 sessions x up to 4 turns, 64 output tokens) on a shared
  line: an unpaced bulk TCP flow from A to B runs through the whole measured window (it takes its
  TCP share of the rate from the KV transfers) and the delay jitters by +-5 ms. The regime
  where the simulator says RelayDecode pays for itself (docs/sim.md section D).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sglang_pdd.lab.bench.trace_workload import TraceSlice
from sglang_pdd.lab.workload.distributions import HitBucket, HitHistogram, LengthRange
from sglang_pdd.lab.workload.generator import WorkloadConfig, generate
from sglang_pdd.lab.workload.request import WorkloadRequest


@dataclass(frozen=True)
class Link:
    delay_ms: float = 20.0  # one way
    rate_mbit: float | None = 100.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


@dataclass(frozen=True)
class Sla:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


@dataclass(frozen=True)
class Background:
    """A bulk TCP flow sharing the link over the measured window (testbed/bulk_flow.py)."""
    src: str = "A"
    dst: str = "B"
    pace_mbit: float | None = None  # None: as fast as TCP lets it
    port: int = 45000


@dataclass(frozen=True)
class Preset:
    name: str
    workload: WorkloadConfig
    max_sessions: int
    max_turns: int
    link: Link = field(default_factory=Link)
    sla: Sla = field(default_factory=Sla)
    request_timeout_s: float = 300.0
    background: Background | None = None
    trace: TraceSlice | None = None  # --trace: a recorded trace replaces the generated workload

    def requests(self) -> list[WorkloadRequest]:
        """The trace this preset replays (warm-ups included), see `select`; a recorded one's slice
        with `trace`."""
        if self.trace is not None:
            return self.trace.requests()
        return select(generate(self.workload), self.max_sessions, self.max_turns)

    def describe_workload(self) -> str:
        if self.trace is not None:
            return self.trace.describe()
        return (f"preset {self.name}: generated agentic sessions (seed {self.workload.seed}), the first "
                f"{self.max_sessions} sessions with up to {self.max_turns} turns each")


def with_trace(preset: Preset, trace: TraceSlice) -> Preset:
    """`preset`'s link, SLA and timeout with a recorded trace as the workload."""
    return replace(preset, name=f"trace-{trace.name}", trace=trace)


def with_sla(preset: Preset, ttft_s: float | None, tpot_s: float | None) -> Preset:
    """`preset` with the SLA targets given (None: the preset's own)."""
    sla = Sla(ttft_s if ttft_s is not None else preset.sla.ttft_s, tpot_s if tpot_s is not None else preset.sla.tpot_s)
    if sla.ttft_s <= 0 or sla.tpot_s <= 0:
        raise ValueError("--ttft-sla and --tpot-sla must be > 0")
    return replace(preset, sla=sla)


def select(reqs: list[WorkloadRequest], max_sessions: int, max_turns: int) -> list[WorkloadRequest]:
    """The first `max_sessions` sessions (by their first measured turn) with at most `max_turns`
    measured turns each, plus their warm-ups; arrivals shifted so the first measured turn is at 0.

    Dropping a session's *last* turns keeps every kept prompt intact (a turn only refers back)."""
    first: dict[int, float] = {}
    for r in reqs:
        if not r.warmup:
            first.setdefault(r.session_id, r.arrival_s)
    keep = set(sorted(first, key=lambda s: (first[s], s))[:max_sessions])
    out, turns = [], {s: 0 for s in keep}
    for r in reqs:
        if r.session_id not in keep:
            continue
        if not r.warmup:
            if turns[r.session_id] >= max_turns:
                continue
            turns[r.session_id] += 1
        out.append(r)
    t0 = min((first[s] for s in keep), default=0.0)
    return [replace(r, arrival_s=round(r.arrival_s - t0, 6)) for r in out]


def _cpu_workload(**kw) -> WorkloadConfig:
    base = dict(
        request_rate=1.0, duration_s=60.0, input_len=LengthRange(1500, 2000), max_input_len=3000,
        output_len=LengthRange(32, 32), odd_fraction=0.0, system_prompt_len=256, agent_types=2,
        mean_turns=6.0, think_time_s=1.0, nominal_tpot_s=0.02, vocab_size=2048, seed=8,
        hit_histogram=HitHistogram.default())
    base.update(kw)
    return WorkloadConfig.cpu_bench(**base)


PRESETS: dict[str, Preset] = {
    "smoke": Preset("smoke", _cpu_workload(), max_sessions=4, max_turns=4),
    "handoff": Preset("handoff", _cpu_workload(output_len=LengthRange(160, 160)), max_sessions=6, max_turns=3),
    # odd traffic worth filtering: a third of turns have short outputs, and low-hit turns are common
    "odd": Preset("odd", _cpu_workload(output_len=LengthRange(64, 64), odd_fraction=0.3,
                                       odd_output_len=LengthRange(8, 24), hit_histogram=HitHistogram((
                                           HitBucket(0.00, 0.50, 0.30), HitBucket(0.50, 0.90, 0.10),
                                           HitBucket(0.90, 0.95, 0.15), HitBucket(0.95, 0.99, 0.25),
                                           HitBucket(0.99, 1.00, 0.20)))),
                  max_sessions=6, max_turns=4),
    "cold": Preset("cold", _cpu_workload(output_len=LengthRange(16, 16), request_rate=0.3,
                                         hit_histogram=HitHistogram((HitBucket(0.0, 0.05, 1.0),))),
                   max_sessions=4, max_turns=2),
    "paper": Preset("paper", _cpu_workload(request_rate=1.0, duration_s=120.0, output_len=LengthRange(64, 64),
                                           odd_fraction=0.035, odd_output_len=LengthRange(8, 32),
                                           mean_turns=8.0),
                    max_sessions=8, max_turns=6),
}

PRESETS["demo"] = replace(PRESETS["cold"], name="demo", max_sessions=3)
PRESETS["congested"] = replace(PRESETS["paper"], name="congested", max_sessions=6, max_turns=4,
                               link=Link(jitter_ms=5.0), background=Background())


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None
