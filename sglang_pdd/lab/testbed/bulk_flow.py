"""A background bulk TCP flow over the testbed's WAN link: the traffic of a shared, congested line.

    flow = BulkFlow(tb, src="A", dst="B", port=45000, pace_mbit=None).start()
    before = flow.wire_bytes()        # {"A->B": n, "B->A": n}: this flow's bytes on the link
    ...                               # the measured work shares the link with it
    after = flow.wire_bytes()
    flow.stop()

The sink runs in `dst`'s namespace and the sender in `src`'s, each its own process
(`python -m sglang_pdd.lab.testbed.bulk_flow sink|send ...`), so its CPU shows up separately in a
benchmark's CPU table and never holds the client's GIL. Without `pace_mbit` the sender writes as
fast as TCP lets it: alone it carries the whole line (~96 of 100 Mbit/s), and beside other flows it
takes its TCP share of the rate from them, as a bulk copy on a shared WAN does. It does not build a
standing queue: the link's tbf sits on the sending host, where TCP small queues keep each socket's
backlog to about a millisecond of data (the wait is in the sender's socket, not in the link). With
`pace_mbit` it is paced by the kernel (`SO_MAX_PACING_RATE`) at that rate.

`wire_bytes` counts the flow with two rules in the raw tables of the namespaces (data arriving in
`dst` on the flow's port, ACKs arriving in `src` from it), inserted before the delay daemon's NFQUEUE
rule; each counts IP bytes, and 14 bytes of Ethernet header per packet make them the link counters'
L2 bytes (`Testbed.link_bytes`), so a benchmark can leave the flow out of its own WAN bytes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from sglang_pdd.lab.testbed.link import IFNAME
from sglang_pdd.lab.testbed.testbed import child_env

logger = logging.getLogger(__name__)

SO_MAX_PACING_RATE = 47  # linux/asm-generic/socket.h
ETH_HEADER = 14
CHUNK = 1 << 20
CONNECT_TIMEOUT_S = 10.0


def _rule(port_match: str, port: int) -> list[str]:
    return ["PREROUTING", "-i", IFNAME, "-p", "tcp", port_match, str(port)]


def _counted(ns, port_match: str, port: int) -> int:
    """L2 bytes the namespace's counting rule for `port` has seen (0 when it is absent)."""
    out = ns.run(["iptables", "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n"], check=False).stdout
    key = f"{'dpt' if port_match == '--dport' else 'spt'}:{port}"
    for line in out.splitlines():
        f = line.split()
        if key in f and f[0].isdigit():
            return int(f[1]) + ETH_HEADER * int(f[0])
    return 0


class BulkFlow:
    """One bulk TCP flow from `src` to `dst` across `tb`'s link (see the module docstring)."""

    def __init__(self, tb, src: str = "A", dst: str = "B", port: int = 45000,
                 pace_mbit: float | None = None) -> None:
        if src == dst:
            raise ValueError("a bulk flow crosses the link: src and dst must differ")
        self.tb, self.src, self.dst, self.port, self.pace_mbit = tb, src, dst, port, pace_mbit
        self._procs: list[subprocess.Popen] = []
        self._rules: list[tuple[object, list[str]]] = []

    def describe(self) -> dict:
        return {"direction": f"{self.src}->{self.dst}", "flows": 1, "port": self.port,
                "pace_mbit": self.pace_mbit, "kind": "paced TCP" if self.pace_mbit else "unpaced TCP (as fast as TCP lets it)"}

    def start(self) -> "BulkFlow":
        sns, dns = self.tb.ns(self.src), self.tb.ns(self.dst)
        for ns, match in ((dns, "--dport"), (sns, "--sport")):
            rule = _rule(match, self.port)
            ns.run(["iptables", "-w", "-t", "raw", "-I", *rule[:1], "1", *rule[1:]])
            self._rules.append((ns, rule))
        exe = [sys.executable, "-m", "sglang_pdd.lab.testbed.bulk_flow"]
        dst_addr = self.tb.addr(self.dst)
        self._procs.append(subprocess.Popen(dns.argv(exe + ["sink", "--host", dst_addr, "--port", str(self.port)]),
                                            env=child_env(), stdout=subprocess.DEVNULL, start_new_session=True))
        send = exe + ["send", "--host", dst_addr, "--port", str(self.port)]
        if self.pace_mbit:
            send += ["--pace-mbit", f"{self.pace_mbit:g}"]
        self._procs.append(subprocess.Popen(sns.argv(send), env=child_env(), stdout=subprocess.DEVNULL,
                                            start_new_session=True))
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while self.wire_bytes()[f"{self.src}->{self.dst}"] == 0:  # flowing: the sink accepted and data arrives
            for p in self._procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"bulk flow: {p.args[-6:]} exited with {p.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"bulk flow {self.src}->{self.dst} carried no data within {CONNECT_TIMEOUT_S:g} s")
            time.sleep(0.05)
        logger.info("bulk flow %s->%s on port %d started (%s)", self.src, self.dst, self.port,
                    self.describe()["kind"])
        return self

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.poll() is None]

    def wire_bytes(self) -> dict[str, int]:
        fwd = _counted(self.tb.ns(self.dst), "--dport", self.port)
        back = _counted(self.tb.ns(self.src), "--sport", self.port)
        return {f"{self.src}->{self.dst}": fwd, f"{self.dst}->{self.src}": back}

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._procs.clear()
        for ns, rule in self._rules:
            ns.run(["iptables", "-w", "-t", "raw", "-D", *rule], check=False)
        self._rules.clear()

    def __enter__(self) -> "BulkFlow":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _sink(host: str, port: int) -> None:
    srv = socket.create_server((host, port), reuse_port=False)
    conn, _ = srv.accept()
    buf = bytearray(CHUNK)
    while conn.recv_into(buf):
        pass


def _send(host: str, port: int, pace_mbit: float | None) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.settimeout(None)
    if pace_mbit:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(pace_mbit * 1e6 / 8))
    data = b"\0" * CHUNK
    while True:
        sock.sendall(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testbed.bulk_flow")
    ap.add_argument("role", choices=("sink", "send"))
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pace-mbit", type=float, default=None)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if args.role == "sink":
            _sink(args.host, args.port)
        else:
            _send(args.host, args.port, args.pace_mbit)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
