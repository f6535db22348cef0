"""Two namespaces, "cluster A" and "cluster B", joined by an emulated WAN link.

    with Testbed("pdd", delay_ms=20, rate_mbit=100) as tb:
        server = subprocess.Popen(tb.ns("B").argv([...]))      # listens on tb.addr("B")
        before = tb.link_bytes()
        ...                                                      # client in A talks to tb.addr("B")
        wan = {k: tb.link_bytes()[k] - before[k] for k in before}

Loopback inside each namespace is untouched, so servers within one cluster talk at memory speed;
only traffic over `wan0` is shaped. `up()` is idempotent (a healthy testbed with the same
configuration is kept, anything else of the same prefix is torn down and rebuilt); `down()` is
idempotent and stops only the delay daemons it recorded (checked by command line), then deletes the
two namespaces, which removes the veth pair and the iptables rules with them. Processes someone
else started inside the namespaces are stopped by the deletion (and logged): stop them first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from .netns import NetNS, netns_supported
from . import link
from .config import LinkConfig
from .probe import ProbeReport
from .state import (
    DAEMON_MODULE,
    DaemonRecord,
    RunState,
    check_prefix,
    default_run_dir,
    find_daemons,
    is_our_daemon,
    stop_daemon,
)

logger = logging.getLogger(__name__)

SIDES = ("A", "B")
DAEMON_READY_TIMEOUT_S = 10.0


class TestbedError(RuntimeError):
    """The testbed could not be brought up (or a side does not exist)."""

    __test__ = False  # not a pytest test class


def _other(side: str) -> str:
    return "B" if side == "A" else "A"


def child_env() -> dict[str, str]:
    """Our environment, with the directory holding this `sglang_pdd` first on PYTHONPATH, so the
    daemons and probes we start import this very copy of the package."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class Testbed:
    """The two-cluster testbed; see the module docstring."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        prefix: str = "pdd",
        delay_ms: float = 20.0,
        jitter_ms: float = 0.0,
        rate_mbit: float | None = 100.0,
        loss_pct: float = 0.0,
        backend: str = "auto",
        subnet: str = "10.77.0.0/30",
        run_dir: str | Path | None = None,
        config: LinkConfig | None = None,
    ) -> None:
        self.prefix = check_prefix(prefix)
        self.config = config or LinkConfig(delay_ms, jitter_ms, rate_mbit, loss_pct, backend)
        self.subnet = subnet
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self._cidr = dict(zip(SIDES, link.subnet_hosts(subnet)))
        self._ns = {s: NetNS(f"{prefix}{s}") for s in SIDES}
        self._children: dict[int, subprocess.Popen] = {}
        self.backend = ""  # resolved by up()

    @classmethod
    def from_state(cls, prefix: str, run_dir: str | Path | None = None) -> Testbed:
        """The testbed a previous `up()` (maybe in another process) recorded under `run_dir`."""
        rd = Path(run_dir) if run_dir is not None else default_run_dir()
        st = RunState.load(rd, prefix)
        if st is None:
            return cls(prefix, run_dir=rd)
        tb = cls(prefix, subnet=st.subnet, run_dir=rd, config=LinkConfig.from_json(st.config))
        tb.backend = st.backend
        return tb

    # -- accessors ---------------------------------------------------------------------------------

    def ns(self, side: str) -> NetNS:
        """The namespace of cluster "A" or "B" (run things there with `.argv([...])`)."""
        try:
            return self._ns[side]
        except KeyError:
            raise TestbedError(f"no side {side!r}; sides are {SIDES}") from None

    def addr(self, side: str) -> str:
        """The address of a side's end of the link (no prefix length)."""
        self.ns(side)
        return self._cidr[side].split("/")[0]

    def daemon_tag(self, receiver: str) -> str:
        return f"{self.prefix}/{_other(receiver)}2{receiver}"

    def daemon_pids(self) -> dict[str, int]:
        """Receiving side -> PID of the delay daemon delaying traffic into it (nfqueue backend)."""
        st = RunState.load(self.run_dir, self.prefix)
        return {d.side: d.pid for d in st.daemons} if st else {}

    def link_bytes(self) -> dict[str, int]:
        """Bytes each side has put on the link since `up()`: {"A->B": n, "B->A": n}.

        veth transmit counters of L2 frames (IP + TCP/UDP headers + 14 B Ethernet header per frame,
        or per GSO super-frame). Lost packets (loss knob) count with the nfqueue backend, which
        drops them on arrival, and do not with netem, which drops them before the wire."""
        return {f"{s}->{_other(s)}": link.tx_bytes(self.ns(s)) for s in SIDES}

    # -- lifecycle -------------------------------------------------------------------------------

    def is_up(self) -> bool:
        """Both namespaces exist, the state file matches, and every recorded daemon is alive."""
        st = RunState.load(self.run_dir, self.prefix)
        if st is None or not all(n.exists() for n in self._ns.values()):
            return False
        if st.config != self.config.to_json() or st.subnet != self.subnet:
            return False
        want = self._wants_daemons(st.backend)
        alive = {d.side for d in st.daemons if is_our_daemon(d.pid, d.tag)}
        return alive == (set(SIDES) if want else set())

    def up(self) -> Testbed:
        ok, why = netns_supported()
        if not ok:
            raise TestbedError(why)
        missing = link.tools_missing(self.config.backend)
        if missing:
            raise TestbedError(f"missing tools: {', '.join(missing)} (apt-get install iproute2 iptables)")
        if self.is_up():
            self.backend = RunState.load(self.run_dir, self.prefix).backend  # type: ignore[union-attr]
            logger.info("testbed %s already up", self.prefix)
            return self
        self.down()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        logger.info("testbed %s up: %s <-> %s, %s, backend %s", self.prefix, self._cidr["A"], self._cidr["B"],
                    self.config.describe(), self.backend)
        return self

    def _wants_daemons(self, backend: str) -> bool:
        return backend == "nfqueue" and self.config.impaired

    def _build(self) -> None:
        a, b = self._ns["A"], self._ns["B"]
        a.create()
        b.create()
        st = RunState(self.prefix, {s: n.name for s, n in self._ns.items()}, self.subnet, self.config.to_json())
        st.save(self.run_dir)
        link.create_pair(a, b, self._cidr["A"], self._cidr["B"])
        self.backend = self._resolve_backend()
        st.backend = self.backend
        st.save(self.run_dir)
        for side in SIDES:
            link.apply_shaping(self._ns[side], self.config, use_netem=self.backend == "netem")
        if self._wants_daemons(self.backend):
            for side in SIDES:
                link.add_queue_rule(self._ns[side])  # before the daemon: closed until it listens
            self._start_daemons(st)

    def _resolve_backend(self) -> str:
        want = self.config.backend
        if not self.config.impaired:
            return "tbf" if self.config.shaped else "none"
        if want == "auto":
            want = "netem" if link.netem_available(self._ns["A"]) else "nfqueue"
        elif want == "netem" and not link.netem_available(self._ns["A"]):
            raise TestbedError("this kernel has no netem qdisc; use backend 'nfqueue' or 'auto'")
        if want == "nfqueue" and link.tools_missing("nfqueue"):
            raise TestbedError("the nfqueue backend needs iptables (apt-get install iptables)")
        return want

    def _start_daemons(self, st: RunState) -> None:
        cfg = self.config
        env = child_env()
        pending: dict[str, tuple[subprocess.Popen, Path]] = {}
        for side in SIDES:
            tag = self.daemon_tag(side)
            ready = self.run_dir / f"{self.prefix}-{side}.ready"
            ready.unlink(missing_ok=True)
            argv = [sys.executable, "-m", DAEMON_MODULE, "--queue", str(link.NFQUEUE_NUM),
                    "--delay-ms", f"{cfg.delay_ms}", "--jitter-ms", f"{cfg.jitter_ms}", "--loss-pct", f"{cfg.loss_pct}",
                    "--ready-file", str(ready), "--tag", tag] + (["--per-packet"] if cfg.loss_pct > 0 else [])
            with open(self.run_dir / f"{self.prefix}-{side}.log", "ab") as log:
                proc = subprocess.Popen(self._ns[side].argv(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        env=env, start_new_session=True)
            self._children[proc.pid] = proc
            st.daemons.append(DaemonRecord(proc.pid, tag, side))
            st.save(self.run_dir)
            pending[side] = (proc, ready)
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        for side, (proc, ready) in pending.items():
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    log_tail = (self.run_dir / f"{self.prefix}-{side}.log").read_text(errors="replace")[-2000:]
                    raise TestbedError(f"delay daemon in {self._ns[side].name} did not start:\n{log_tail}")
                time.sleep(0.02)
            ready.unlink(missing_ok=True)

    def _stop_daemons(self, st: RunState | None) -> None:
        records = list(st.daemons) if st else []
        # daemons an interrupted up() started but never recorded
        recorded = {d.pid for d in records}
        for side in SIDES:
            records += [DaemonRecord(p, self.daemon_tag(side), side) for p in find_daemons(self.daemon_tag(side))
                        if p not in recorded]
        for d in records:
            if stop_daemon(d.pid, d.tag):
                logger.debug("stopped delay daemon %d (%s)", d.pid, d.tag)
            child = self._children.pop(d.pid, None)
            if child is not None:
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    logger.warning("delay daemon %d did not exit", d.pid)
        for pid, child in list(self._children.items()):  # reap anything else we spawned
            if child.poll() is not None:
                self._children.pop(pid)

    def down(self) -> None:
        """Stop this testbed's daemons, delete its namespaces and its state. Safe to repeat."""
        st = RunState.load(self.run_dir, self.prefix)
        self._stop_daemons(st)
        for n in self._ns.values():
            n.delete()
        for side in SIDES:
            for suffix in (".ready", ".log"):
                (self.run_dir / f"{self.prefix}-{side}{suffix}").unlink(missing_ok=True)
        RunState.remove(self.run_dir, self.prefix)

    def reconfigure(self, **changes: object) -> None:
        """Change the link in place (e.g. `reconfigure(delay_ms=10)`), keeping the namespaces and
        whatever runs in them. With the nfqueue backend the daemons restart: the link drops packets
        for that moment (TCP retransmits), it never passes them undelayed."""
        new = replace(self.config, **changes)  # type: ignore[arg-type]
        if new.backend != self.config.backend:
            raise TestbedError("reconfigure cannot switch the backend; down() and up() instead")
        st = RunState.load(self.run_dir, self.prefix)
        if st is None or not self.is_up():
            raise TestbedError(f"testbed {self.prefix} is not up")
        self.config = new
        self._stop_daemons(st)
        st.daemons = []
        self.backend = self._resolve_backend()
        st.backend, st.config = self.backend, new.to_json()
        st.save(self.run_dir)
        for side in SIDES:
            link.apply_shaping(self._ns[side], new, use_netem=self.backend == "netem")
            if self._wants_daemons(self.backend):
                link.add_queue_rule(self._ns[side])
            else:
                link.remove_queue_rule(self._ns[side])
        if self._wants_daemons(self.backend):
            self._start_daemons(st)

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- measurement -------------------------------------------------------------------------------

    def default_bulk_bytes(self) -> int:
        """About 1.5 s of line rate, between 8 MB and 256 MB (64 MB when the rate is unlimited)."""
        if not self.config.shaped:
            return 64 << 20
        return int(min(max((self.config.rate_mbit or 0) * 1e6 / 8 * 1.5, 8 << 20), 256 << 20))

    @contextlib.contextmanager
    def probe_server(self, side: str = "B") -> Iterator[int]:
        """A probe server (TCP echo/bulk + UDP collector, see `probe`) on `addr(side)`; yields its port."""
        server = subprocess.Popen(
            self.ns(side).argv([sys.executable, "-m", "sglang_pdd.lab.testbed.probe", "serve", "--host", self.addr(side)]),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=child_env(),
        )
        try:
            line = server.stdout.readline().strip()  # type: ignore[union-attr]
            if not line.isdigit():
                raise TestbedError(f"probe server in {self.ns(side).name} did not start")
            yield int(line)
        finally:
            server.terminate()
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def probe(self, rtt_count: int = 20, bulk_bytes: int | None = None, timeout_s: float = 120.0) -> ProbeReport:
        """Application-level RTT (TCP echo, A -> B) and bulk rate in each direction.

        A probe server runs in B, the client in A; both are stopped before this returns."""
        bulk = self.default_bulk_bytes() if bulk_bytes is None else bulk_bytes
        with self.probe_server("B") as port:
            out = self.ns("A").run(
                [sys.executable, "-m", "sglang_pdd.lab.testbed.probe", "measure", "--host", self.addr("B"),
                 "--port", str(port), "--rtt-count", str(rtt_count), "--bulk-bytes", str(bulk)],
                env=child_env(), timeout=timeout_s,
            ).stdout
        return ProbeReport(**json.loads(out.strip().splitlines()[-1]))
