"""The testbed's record in its run directory, and stopping exactly the processes it names.

`<run_dir>/<prefix>.json` says which namespaces and delay daemons a testbed made, so that
`python -m sglang_pdd.lab.testbed down` from another process can take it apart. A PID is only signalled
after `/proc/<pid>/cmdline` shows the delay daemon module with this testbed's tag: a recycled PID
belonging to anything else is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DAEMON_MODULE = "sglang_pdd.lab.testbed.delay_daemon"
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,23}$")


def default_run_dir() -> Path:
    """Where state lives when the caller names no run directory: under the system temp dir."""
    return Path(tempfile.gettempdir()) / "sglang-pdd-testbed"


def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"testbed prefix {prefix!r}: want a letter then up to 23 of [A-Za-z0-9_-]")
    return prefix


@dataclass
class DaemonRecord:
    pid: int
    tag: str  # unique per testbed and direction, also on the daemon's command line
    side: str  # the namespace it runs in ("A" or "B")


@dataclass
class RunState:
    prefix: str
    namespaces: dict[str, str]  # side -> namespace name
    subnet: str
    config: dict
    backend: str = ""
    daemons: list[DaemonRecord] = field(default_factory=list)

    @staticmethod
    def path(run_dir: Path, prefix: str) -> Path:
        return Path(run_dir) / f"{prefix}.json"

    def save(self, run_dir: Path) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(run_dir, self.prefix).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.rename(self.path(run_dir, self.prefix))

    @classmethod
    def load(cls, run_dir: Path, prefix: str) -> RunState | None:
        p = cls.path(run_dir, prefix)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("unreadable testbed state %s (%s): ignoring it", p, e)
            return None
        d["daemons"] = [DaemonRecord(**r) for r in d.get("daemons", [])]
        return cls(**d)

    @classmethod
    def remove(cls, run_dir: Path, prefix: str) -> None:
        cls.path(run_dir, prefix).unlink(missing_ok=True)


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def is_our_daemon(pid: int, tag: str) -> bool:
    """Whether `pid` is a live (non-zombie) delay daemon started with `--tag tag`."""
    argv = cmdline(pid)
    if DAEMON_MODULE not in argv:
        return False
    try:
        return argv[argv.index("--tag") + 1] == tag
    except (ValueError, IndexError):
        return False


def find_daemons(tag: str) -> list[int]:
    """PIDs of every live delay daemon with this tag (finds ones a crashed `up` did not record)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and is_our_daemon(int(entry), tag):
            pids.append(int(entry))
    return pids


def stop_daemon(pid: int, tag: str, grace_s: float = 3.0) -> bool:
    """SIGTERM (then SIGKILL) `pid` if it is our daemon; True if it was ours and is now gone."""
    if not is_our_daemon(pid, tag):
        return False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not is_our_daemon(pid, tag):  # exited (a zombie has an empty cmdline)
                return True
            time.sleep(0.02)
    logger.warning("delay daemon %d (%s) survived SIGKILL", pid, tag)
    return False
