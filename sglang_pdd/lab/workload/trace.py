"""Workload traces as JSONL: one `WorkloadRequest.to_dict()` per line (the bench writes them, the
simulator and the replaying client read them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from sglang_pdd.lab.workload.request import WorkloadRequest


def write_jsonl(reqs: Iterable[WorkloadRequest], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in reqs:
            f.write(json.dumps(r.to_dict(), separators=(",", ":")) + "\n")


def read_jsonl(path: str | Path) -> list[WorkloadRequest]:
    return list(iter_jsonl(path))


def iter_jsonl(path: str | Path) -> Iterator[WorkloadRequest]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield WorkloadRequest.from_dict(json.loads(line))
