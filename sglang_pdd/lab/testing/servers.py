"""Start, wait for, and stop server processes (sglang servers, routers) with their own logs.

Each server runs in its own session / process group, so `stop()` ends exactly the processes that
server started (its scheduler and detokenizer included) and nothing else. Readiness is an HTTP
probe; a process that dies while starting raises at once with the tail of its log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Protocol

logger = logging.getLogger(__name__)


# Never inherited by a server: a test process may run Triton's interpreter for its own kernel tests.
SCRUBBED_ENV = ("TRITON_INTERPRET",)


class Launchable(Protocol):
    url: str

    def argv(self) -> list[str]: ...

    def environ(self) -> dict[str, str]: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    pass


def http_json(url: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, dict | str]:
    """POST `body` (or GET when None); return (status, parsed JSON or text). Never raises on 4xx/5xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class ServerProcess:
    def __init__(self, name: str, config: Launchable, log_dir: str):
        self.name = name
        self.config = config
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return self.config.url

    def start(self) -> "ServerProcess":
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        log = open(self.log_path, "ab")
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        env.update(self.config.environ())
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.config.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )
        log.close()
        logger.info("started %s (pid %d): %s", self.name, self.proc.pid, self.log_path)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 240.0, path: str = "/health") -> "ServerProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(f"{self.name} exited ({self.proc.returncode}) while starting:\n{self.log_tail()}")
            try:
                status, _ = http_json(self.url + path, timeout=5)
                if status == 200:
                    self.ready_after_s = time.monotonic() - self.started_at
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise ServerStartError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def group_pids(self) -> list[int]:
        """Live processes of this server's process group."""
        if self.proc is None:
            return []
        pgid, out = self.proc.pid, []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(d))
        return out

    def child_start_methods(self) -> set[str]:
        """How sglang started this server's children (the launcher left out): "fork" for a child whose
        auxiliary vector is the launcher's (it never ran exec: the vector's addresses are set at exec, and
        randomized), "spawn" for one that ran exec (a fresh interpreter). Their command lines cannot tell:
        sglang renames its processes (``sglang::scheduler``)."""
        def auxv(pid: int) -> bytes | None:
            try:
                with open(f"/proc/{pid}/auxv", "rb") as f:
                    return f.read()
            except OSError:
                return None

        if self.proc is None:
            return set()
        launcher = auxv(self.proc.pid)
        return {"fork" if auxv(pid) == launcher else "spawn"
                for pid in self.group_pids() if pid != self.proc.pid and auxv(pid) is not None}

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL whatever is left after `grace_s`."""
        stop_all([self], grace_s)

    def _signal(self, sig: int) -> bool:
        """`sig` to the process group; False when nothing of it is left."""
        if self.proc is None or not self.group_pids():
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        left = self.group_pids()
        if left:
            logger.error("%s: processes survived SIGKILL: %s", self.name, left)


def stop_all(servers: list[ServerProcess], grace_s: float = 15.0) -> None:
    """SIGTERM every server's process group at once, wait until all are gone (SIGKILL what is left after
    `grace_s`): a group of servers shuts down in the time of its slowest, not in the sum. `grace_s` 0:
    SIGKILL at once (servers whose shutdown nobody observes: sglang's own SIGTERM path drains, then
    its parent sleeps 5 s "before crash diagnostics" when a child exits first, 5-25 s a group)."""
    steps = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)) if grace_s > 0 else ((signal.SIGKILL, 5.0),)
    for sig, wait_s in steps:
        live = [s for s in servers if s._signal(sig)]
        deadline = time.monotonic() + wait_s
        while live and time.monotonic() < deadline:
            time.sleep(0.2)
            live = [s for s in live if s.group_pids()]
        if not live:
            break
    for s in servers:
        if s.proc is not None:
            s._reap()


class ServerGroup:
    """Servers started together (one test module, the demo, one benchmark system); stopped together."""

    def __init__(self, log_dir: str, grace_s: float = 15.0):
        self.log_dir = log_dir
        self.grace_s = grace_s  # stop_all's: 0 kills at once
        self.servers: list[ServerProcess] = []

    def start(self, name: str, config: Launchable) -> ServerProcess:
        s = ServerProcess(name, config, self.log_dir).start()
        self.servers.append(s)
        return s

    def stop(self) -> None:
        stop_all(self.servers, self.grace_s)
        self.servers.clear()

    def __enter__(self) -> "ServerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
