"""One benchmark point in a child process under a time bound: a stall is reported with its point, and the rest runs.

A kernel that never finishes (a runtime hang), or a compile that does not end (ptxas on a kernel with huge
register tiles), blocks the process that launched it for good; no timer inside that process can take it
back. So each point runs in a child of its own (its own session, so ptxas and other helpers go with it),
and the parent waits at most `timeout_s`:

    child:   stage("first call (compile)") ... stage("timing") ... emit({...})    # lines on stdout
    parent:  run_child(argv, timeout_s) -> Outcome("ok" | "STALL" | "ERROR", result, stage, seconds, tail)

On a timeout the parent kills the child's process group and reports STALL with the last stage the child
announced (so a stall in compiling is told from one in running). A child that exits without a result is
an ERROR with the tail of its output.

Test hook: a child whose point label equals `$SGLANG_PDD_BENCH_STALL` sleeps instead of running (`stall_if_asked`),
so tests can force a stall.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STALL_ENV = "SGLANG_PDD_BENCH_STALL"
RESULT = "RESULT "
STAGE = "STAGE "
TAIL_LINES = 15


@dataclass
class Outcome:
    status: str  # "ok" (the child printed a result and exited 0), "STALL" or "ERROR"
    result: dict[str, Any] = field(default_factory=dict)
    stage: str = ""  # the last stage the child announced
    seconds: float = 0.0
    tail: str = ""  # the child's last lines of output, for ERROR and STALL

    def why(self) -> str:
        """One line: what went wrong, for a table's notes."""
        if self.status == "STALL":
            return f"no result within {self.seconds:.0f} s (last stage: {self.stage or 'start-up'})"
        if self.status == "ERROR":
            last = [ln for ln in self.tail.splitlines() if ln.strip()]
            return (last[-1] if last else "no output")[:160]
        return ""


def run_child(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
              cwd: str | None = None) -> Outcome:
    """Run `argv` and wait at most `timeout_s` for it; parse its STAGE and RESULT lines."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(0.1, timeout_s))
        stalled = False
    except subprocess.TimeoutExpired:
        stalled = True
        _kill_group(proc)
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    stage, result = "", None
    for line in (out or "").splitlines():
        if line.startswith(STAGE):
            stage = line[len(STAGE):].strip()
        elif line.startswith(RESULT):
            try:
                result = json.loads(line[len(RESULT):])
            except json.JSONDecodeError:
                result = None
    tail = "\n".join((out or "").splitlines()[-TAIL_LINES:])
    if stalled:
        return Outcome("STALL", result or {}, stage, seconds, tail)
    if proc.returncode != 0 or result is None:
        return Outcome("ERROR", result or {}, stage, seconds, tail or f"exit status {proc.returncode}")
    return Outcome("ok", result, stage, seconds, "")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def child_env(smoke: bool) -> dict[str, str]:
    """A point child's environment: compiled on a GPU; Triton's interpreter only for the smoke shapes
    (TRITON_INTERPRET is read when the kernel modules are imported, in the child)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    return env


# -- the child's side ---------------------------------------------------------------------------------


def stage(text: str) -> None:
    """Announce what the child does next (the parent names it if the child stalls there)."""
    print(STAGE + text, flush=True)


def emit(result: dict[str, Any]) -> None:
    """The child's one result (a JSON object on one line)."""
    print(RESULT + json.dumps(result), flush=True)


def stall_if_asked(label: str) -> None:
    """Sleep for good when `$SGLANG_PDD_BENCH_STALL` names this point (tests force a stall with it)."""
    if os.environ.get(STALL_ENV) == label:
        stage("sleeping: forced stall (" + STALL_ENV + ")")
        time.sleep(10**6)


def timer(smoke: bool) -> Callable[[Callable[[], Any]], float]:
    """Milliseconds per call: do_bench's median on a GPU; one call after a warm-up one on CPU (smoke)."""
    if smoke:
        def cpu_time(fn: Callable[[], Any]) -> float:
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return cpu_time
    from triton.testing import do_bench

    return lambda fn: float(do_bench(fn, warmup=10, rep=40))
