"""Application-level link measurements: TCP echo RTT, bulk throughput, UDP one-way delay and order.

`ping` under-reports with an ingress delay (the echo reply is timestamped before it is queued), so
the testbed measures what a program sees. One server (`serve`) answers TCP commands and collects
UDP datagrams on the same port number; the client functions talk to it:

  header "!cQ": b"E" n  echo: then messages of n bytes, each echoed back, until the client closes
                b"U" n  upload: n bytes follow; reply "!Qddd" (bytes; first, half-way, last byte times)
                b"D" n  download: the server sends n bytes
                b"R" 0  report: reply a JSON line [[seq, one-way delay s], ...] of the UDP datagrams
                        received since the last report (arrival order)

Times are CLOCK_MONOTONIC, which both namespaces of one host share, so one-way delays are exact.
Run as `python -m sglang_pdd.lab.testbed.probe serve --host ADDR` inside a namespace (prints the port).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import socketserver
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass

logger = logging.getLogger(__name__)

_HDR = struct.Struct("!cQ")
_UPLOAD_REPLY = struct.Struct("!Qddd")  # bytes, first-byte, half-way, last-byte times
_UDP = struct.Struct("!Qd")  # seq, send time
CHUNK = 256 * 1024
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the cmsg type has the same value
_TIMESPEC = struct.Struct("=qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("peer closed")
        buf += part
    return bytes(buf)


def receive_timed(sock: socket.socket, n: int, buf: bytearray) -> tuple[int, float, float, float]:
    """Read `n` bytes; (n, first, half-way, last byte arrival times).

    The times are the kernel's receive timestamps (SO_TIMESTAMPNS: when the segments reached the
    socket's namespace, not when this thread got to read them), so a reader that waits for a CPU
    does not distort the rate; `time.monotonic()` at each read where the kernel gives none."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    view = memoryview(buf)
    got = 0
    first = half = last = (0.0, None)  # (monotonic, kernel) of the reads that got there
    while got < n:
        k, anc, _flags, _addr = sock.recvmsg_into([view[: min(len(buf), n - got)]], _CMSG_SPACE)
        if not k:
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        kernel = None
        for level, ctype, data in anc:
            if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                kernel = sec + nsec * 1e-9
        stamp = (time.monotonic(), kernel)
        if got == 0:
            first = stamp
        if got < n // 2 <= got + k:
            half = stamp
        got += k
        last = stamp
    stamps = (first, half, last)
    if all(kern is not None for _, kern in stamps):
        return got, first[1], half[1], last[1]  # type: ignore[return-value]
    return got, first[0], half[0], last[0]


class _UdpLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[int, float]] = []

    def take(self) -> list[tuple[int, float]]:
        with self.lock:
            items, self.items = self.items, []
        return items


class _Handler(socketserver.BaseRequestHandler):
    server: ProbeServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            cmd, n = _HDR.unpack(_recv_exact(sock, _HDR.size))
            if cmd == b"E":
                while True:
                    sock.sendall(_recv_exact(sock, n))
            elif cmd == b"U":
                sock.sendall(_UPLOAD_REPLY.pack(*receive_timed(sock, n, self.server.scratch)))
            elif cmd == b"D":
                payload = bytes(CHUNK)
                left = n
                while left > 0:
                    k = min(CHUNK, left)
                    sock.sendall(payload[:k])
                    left -= k
            elif cmd == b"R":
                sock.sendall(json.dumps(self.server.udp_log.take()).encode() + b"\n")
        except (ConnectionError, OSError):
            pass


class ProbeServer(socketserver.ThreadingTCPServer):
    """TCP command server plus a UDP collector on the same port."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.scratch = bytearray(CHUNK)
        self.udp_log = _UdpLog()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, self.server_address[1]))
        threading.Thread(target=self._collect_udp, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def _collect_udp(self) -> None:
        while True:
            try:
                data = self.udp.recv(65536)
            except OSError:
                return
            now = time.monotonic()
            if len(data) >= _UDP.size:
                seq, sent = _UDP.unpack_from(data)
                with self.udp_log.lock:
                    self.udp_log.items.append((seq, now - sent))


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def echo_rtts(host: str, port: int, count: int = 20, size: int = 64, timeout_s: float = 10.0) -> list[float]:
    """Round-trip times (s) of `count` echoes of `size` bytes over one TCP connection.

    One warm-up echo is not counted (it can include the delayed-ACK and slow-start edge)."""
    with _connect(host, port, timeout_s) as sock:
        sock.sendall(_HDR.pack(b"E", size))
        msg = bytes(size)
        rtts: list[float] = []
        for i in range(count + 1):
            t0 = time.monotonic()
            sock.sendall(msg)
            _recv_exact(sock, size)
            if i:
                rtts.append(time.monotonic() - t0)
        return rtts


@dataclass(frozen=True)
class Transfer:
    """A bulk transfer: bytes, first-to-last-byte seconds and rate, and the rate of its second half
    (past TCP slow start: the figure to compare with the configured rate)."""

    nbytes: int
    seconds: float
    mbit: float
    mbit_second_half: float


def _transfer(nbytes: int, first: float, half_t: float, last: float) -> Transfer:
    secs = max(last - first, 1e-9)
    half_bytes = nbytes - nbytes // 2
    return Transfer(nbytes, secs, nbytes * 8 / secs / 1e6, half_bytes * 8 / max(last - half_t, 1e-9) / 1e6)


def upload(host: str, port: int, nbytes: int, timeout_s: float = 60.0) -> Transfer:
    """Send `nbytes` to the server; the rate is measured where the bytes arrive."""
    with _connect(host, port, timeout_s) as sock:
        sock.sendall(_HDR.pack(b"U", nbytes))
        chunk = bytes(CHUNK)
        left = nbytes
        while left > 0:
            k = min(CHUNK, left)
            sock.sendall(chunk[:k])
            left -= k
        got, first, half_t, last = _UPLOAD_REPLY.unpack(_recv_exact(sock, _UPLOAD_REPLY.size))
    return _transfer(got, first, half_t, last)


def download(host: str, port: int, nbytes: int, timeout_s: float = 60.0) -> Transfer:
    """Fetch `nbytes` from the server; first-to-last-byte rate, and the rate of the second half."""
    with _connect(host, port, timeout_s) as sock:
        sock.sendall(_HDR.pack(b"D", nbytes))
        return _transfer(*receive_timed(sock, nbytes, bytearray(CHUNK)))


def udp_burst(host: str, port: int, count: int, interval_s: float, wait_s: float, size: int = 64,
              report_timeout_s: float = 50.0) -> list[tuple[int, float]]:
    """Send `count` numbered datagrams `interval_s` apart, wait `wait_s`, return what the server got:
    [(seq, one-way delay s)] in arrival order.

    The report comes back over TCP through the same link: on a lossy one, a segment lost several times
    over waits out TCP's doubling retransmission timeouts (1 s, 2 s, 4 s, ...), hence the long timeout."""
    size = max(size, _UDP.size)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        t_next = time.monotonic()
        for seq in range(count):
            udp.sendto(_UDP.pack(seq, time.monotonic()).ljust(size, b"\0"), (host, port))
            t_next += interval_s
            time.sleep(max(0.0, t_next - time.monotonic()))
    time.sleep(wait_s)
    with _connect(host, port, report_timeout_s) as sock:
        sock.sendall(_HDR.pack(b"R", 0))
        line = bytearray()
        while not line.endswith(b"\n"):
            part = sock.recv(65536)
            if not part:
                break
            line += part
    return [(int(s), float(d)) for s, d in json.loads(line)]


@dataclass(frozen=True)
class ProbeReport:
    rtt_ms_p50: float
    rtt_ms_min: float
    rtt_ms_max: float
    a_to_b_mbit: float | None  # whole transfer, first to last byte
    b_to_a_mbit: float | None
    a_to_b_mbit_steady: float | None  # second half of the transfer
    b_to_a_mbit_steady: float | None
    bulk_bytes: int

    def to_json(self) -> dict:
        return asdict(self)


def measure(host: str, port: int, rtt_count: int, bulk_bytes: int) -> ProbeReport:
    """The client side of `Testbed.probe`: RTT, then upload (client -> server) and download."""
    rtts = [r * 1e3 for r in echo_rtts(host, port, rtt_count)]
    up = upload(host, port, bulk_bytes) if bulk_bytes else None
    down = download(host, port, bulk_bytes) if bulk_bytes else None
    return ProbeReport(
        rtt_ms_p50=statistics.median(rtts), rtt_ms_min=min(rtts), rtt_ms_max=max(rtts),
        a_to_b_mbit=up.mbit if up else None, b_to_a_mbit=down.mbit if down else None,
        a_to_b_mbit_steady=up.mbit_second_half if up else None,
        b_to_a_mbit_steady=down.mbit_second_half if down else None, bulk_bytes=bulk_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testbed.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the probe server; prints its port on the first line")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, default=0)
    c = sub.add_parser("measure", help="RTT and bulk rate against a server; prints JSON")
    c.add_argument("--host", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--rtt-count", type=int, default=20)
    c.add_argument("--bulk-bytes", type=int, default=16 << 20)
    args = p.parse_args(argv)
    if args.cmd == "serve":
        server = ProbeServer(args.host, args.port)
        print(server.port, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        return 0
    print(json.dumps(measure(args.host, args.port, args.rtt_count, args.bulk_bytes).to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
