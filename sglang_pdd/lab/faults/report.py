"""One scenario's result and the suite's table.

A scenario passes when no request hung or came back silently wrong, nothing leaked afterwards, and,
where a surviving server could absorb the fault (`absorbable`), no request failed.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from sglang_pdd.lab.faults.outcome import CLASSES

VERSION = 1  # of to_json's shape
COLUMNS = ("scenario", "requests", "completed token-identical", "completed after migration",
           "failed with a clear error", "hung", "silently wrong", "leaked afterwards", "verdict")


@dataclass
class ScenarioReport:
    name: str
    absorbable: bool  # a surviving server could finish every request: a failure is a bug
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CLASSES})
    leaked: list[str] = field(default_factory=list)  # what was not back to idle, per server
    migrations: dict[str, float] = field(default_factory=dict)  # "cause/outcome" -> counter delta
    errors: list[str] = field(default_factory=list)  # distinct error messages the clients got
    wrong: list[str] = field(default_factory=list)  # what was wrong, per silently wrong request
    injected: str = ""  # what was done, and when
    harness_error: str = ""  # the scenario could not run to its end
    ttft_s: dict[str, float | None] = field(default_factory=dict)  # median TTFT: migrated / not
    gap_s: dict[str, float | None] = field(default_factory=dict)  # largest client gap: migrated (max) / not (median)
    seeded: dict[str, int] = field(default_factory=dict)  # class -> requests of the seeded conversations

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    @property
    def ok(self) -> bool:
        c = self.counts
        return (not self.harness_error and c["hung"] == 0 and c["wrong"] == 0 and not self.leaked
                and (c["failed"] == 0 or not self.absorbable))

    def add(self, cls: str, seeded: bool = False) -> None:
        self.counts[cls] += 1
        if seeded:
            self.seeded[cls] = self.seeded.get(cls, 0) + 1

    def timing(self, migrated: list, others: list) -> None:
        """TTFT and largest-gap figures from the records of migrated and other completed requests."""
        def med(xs):
            xs = [x for x in xs if x is not None]
            return statistics.median(xs) if xs else None
        self.ttft_s = {"migrated": med([r.ttft_s for r in migrated]), "other": med([r.ttft_s for r in others])}
        self.gap_s = {"migrated": max((r.gap_s for r in migrated), default=None),
                      "other": med([r.gap_s for r in others])}

    def row(self) -> list[str]:
        c = self.counts
        verdict = "ok" if self.ok else "FAIL" + (f" ({self.harness_error})" if self.harness_error else "")
        return [self.name, str(self.requests), str(c["identical"]), str(c["migrated"]), str(c["failed"]),
                str(c["hung"]), str(c["wrong"]), "; ".join(self.leaked) if self.leaked else "0", verdict]


def table(reports: list[ScenarioReport]) -> str:
    """The markdown table of the issue: one row per scenario."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r.row()) + " |" for r in reports]
    return "\n".join(lines)


def details(reports: list[ScenarioReport]) -> str:
    """Per scenario: the injection, the migration counters' deltas, the timing of migrated requests, errors."""
    out = []
    for r in reports:
        out.append(f"* {r.name}: {r.injected or '-'}")
        if r.migrations:
            out.append("  migrations: " + ", ".join(f"{k} +{v:g}" for k, v in sorted(r.migrations.items())))
        if r.gap_s.get("migrated") is not None:
            out.append(f"  migrated: largest client gap {r.gap_s['migrated']:.2f}s (others' median "
                       f"{_s(r.gap_s.get('other'))}), median TTFT {_s(r.ttft_s.get('migrated'))} "
                       f"(others {_s(r.ttft_s.get('other'))})")
        if r.seeded:
            out.append(f"  seeded sampling: {sum(r.seeded.values())} of the requests ("
                       + ", ".join(f"{k} {v}" for k, v in sorted(r.seeded.items())) + ")")
        for e in r.errors[:3]:
            out.append(f"  error: {e}")
        for w in r.wrong[:3]:
            out.append(f"  wrong: {w}")
    return "\n".join(out)


def _s(v) -> str:
    return "-" if v is None else f"{v:.2f}s"


def to_json(reports: list[ScenarioReport], **run) -> dict:
    return {"version": VERSION, **run, "scenarios": [{**asdict(r), "requests": r.requests, "ok": r.ok} for r in reports]}
