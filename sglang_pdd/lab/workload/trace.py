"""Workload traces as JSONL: one `WorkloadRequest.to_dict()` per line (the bench writes them, the
simulator and the replaying client read them). Mooncake-format files (`workload.mooncake`) are
told apart by their fields: `is_mooncake_file`."""

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
    with open_text(path) as f:
        for line in f:
            if line.strip():
                yield WorkloadRequest.from_dict(json.loads(line))


def open_text(path: str | Path):
    """A trace file opened for reading text: `.xz` and `.gz` are decompressed on the fly."""
    name = str(path)
    if name.endswith(".xz"):
        import lzma

        return lzma.open(path, "rt", encoding="utf-8")
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def is_mooncake_file(path: str | Path) -> bool:
    """True if the file's first record has the Mooncake fields (`workload.mooncake`)."""
    from sglang_pdd.lab.workload.mooncake import is_mooncake_record

    with open_text(path) as f:
        for line in f:
            if line.strip():
                return is_mooncake_record(json.loads(line))
    return False
