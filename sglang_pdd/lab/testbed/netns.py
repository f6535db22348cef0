"""Named Linux network namespaces: create, enter, run in, list and kill what runs inside, delete.

sglang's `--nccl-port` store and Mooncake's transfer engine listen on all interfaces, so every server
that tests, the demo or the benchmark start lives inside a namespace made here. A namespace is named
`ip netns` style (a bind mount under /run/netns), which lets anyone list the processes inside it
(`pids()`), so cleanup kills exactly what ran there and nothing else.

Every namespace made here draws its ephemeral (outgoing) ports from `EPHEMERAL_PORTS`, above the fixed
ports that servers listen on (HTTP, `--nccl-port`, bootstrap, all below 46000). The Linux default
(32768-60999) overlaps them: a client socket that happens to take 33201 makes a later server's
`--nccl-port 33201` fail with EADDRINUSE (it did, once, in CI).

Requires root and iproute2. Python 3.11 has no `os.setns`; `enter()` calls libc's setns(2) through
ctypes. setns changes the namespace of the calling thread only: call it before the process starts
other threads, then everything it spawns inherits the namespace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
EPHEMERAL_PORTS = (46000, 60999)


class NetnsError(RuntimeError):
    """A namespace operation failed (not root, no iproute2, or the kernel refused)."""


def netns_supported() -> tuple[bool, str]:
    """Whether this process can make namespaces; the reason when it cannot."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 (`ip`) is not installed"
    return True, ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


@dataclass
class NetNS:
    """One named network namespace with its loopback up."""

    name: str

    @property
    def path(self) -> str:
        return os.path.join(NETNS_DIR, self.name)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def create(self) -> "NetNS":
        """Create the namespace (removing a stale one of the same name first) and bring `lo` up."""
        ok, why = netns_supported()
        if not ok:
            raise NetnsError(why)
        if self.exists():
            self.delete()
        _ip("netns", "add", self.name)
        self.run(["ip", "link", "set", "lo", "up"])
        lo, hi = EPHEMERAL_PORTS
        done = self.run(["sh", "-c", f"echo '{lo} {hi}' > /proc/sys/net/ipv4/ip_local_port_range"], check=False)
        if done.returncode != 0:  # a read-only /proc/sys: servers still start, with the kernel's default range
            logger.warning("%s: could not set the ephemeral port range to %d-%d: %s", self.name, lo, hi,
                           done.stderr.strip())
        return self

    def ephemeral_ports(self) -> tuple[int, int]:
        """The namespace's range of ephemeral ports (`net.ipv4.ip_local_port_range`)."""
        lo, hi = self.run(["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()
        return int(lo), int(hi)

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        proc = subprocess.run(self.argv(argv), **kw)
        if check and proc.returncode != 0:
            raise NetnsError(f"in {self.name}: {' '.join(argv)}: {proc.stderr or proc.returncode}")
        return proc

    def enter(self) -> None:
        """Move the calling thread into this namespace (see the module docstring)."""
        libc = _libc()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(f"setns({self.name}): {os.strerror(err)}")
        finally:
            os.close(fd)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a fresh thread that first enters this namespace; its result.

        Sockets `fn` opens live in this namespace, the caller's thread stays where it is. The
        thread ends with `fn`; exceptions propagate. On timeout a TimeoutError is raised and the
        thread is left to finish on its own (it is a daemon thread)."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                self.enter()
                box["result"] = fn(*args, **kwargs)
            except BaseException as e:  # handed to the caller
                box["error"] = e

        t = threading.Thread(target=target, name=f"netns-{self.name}", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {self.name} still running after {timeout} s")
        if "error" in box:
            raise box["error"]
        return box["result"]

    def pids(self) -> list[int]:
        """PIDs of the processes whose network namespace is this one."""
        if not self.exists():
            return []
        out = _ip("netns", "pids", self.name, check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def kill_all(self, grace_s: float = 5.0) -> list[int]:
        """SIGTERM every process inside, SIGKILL what is left after `grace_s`. Returns the PIDs hit.

        Never touches the calling process (which may have entered the namespace itself).
        """
        me = os.getpid()
        victims = [p for p in self.pids() if p != me]
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            alive = [p for p in victims if _alive(p)]
            if not alive:
                break
            for p in alive:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(_alive(p) for p in alive):
                time.sleep(0.1)
        return victims

    def delete(self) -> None:
        """Kill what still runs inside, then remove the namespace (and with it its veths)."""
        if not self.exists():
            return
        left = self.kill_all()
        if left:
            logger.info("netns %s: stopped %d leftover process(es)", self.name, len(left))
        _ip("netns", "del", self.name, check=False)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    # find_library spawns a helper process (milliseconds): look it up once.
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
