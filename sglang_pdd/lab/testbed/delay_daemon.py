"""The delay daemon: one direction of the emulated WAN, in the receiving namespace.

Run as `python -m sglang_pdd.lab.testbed.delay_daemon --queue 0 --delay-ms 20 ...` inside a namespace
whose `raw PREROUTING -i wan0 -j NFQUEUE --queue-num 0` rule hands it every packet arriving over the
link. It never sees payloads (COPY_META): it holds each packet id until its release time and then
accepts every due packet with one verdict batch. Loss is a drop verdict on arrival. GSO packets
(up to 64 KB) are queued whole, except with `--per-packet` (the testbed sets it when loss > 0, so
that a loss is one wire packet, not a burst of 40): the kernel then segments them first, which costs
the daemon one message per wire packet.

Release time of packet k = max(release of k-1, arrival + delay + jitter sample): jitter never
reorders (netem would), so a TCP flow sees delay variation but no reordering, and the batch verdict
"accept all ids <= n" stays exact because due packets are always a prefix of the queue.

Fail closed: the iptables rule has no `--queue-bypass`, so when this process dies the kernel drops
what it held and everything that arrives afterwards; the link stops instead of running undelayed.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import random
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from .nfqueue import QueueSocket

logger = logging.getLogger(__name__)

# Packets due within this much of now go out in the same batch (the wakeup costs more than that).
RELEASE_SLACK_S = 0.0002


@dataclass
class LinkSchedule:
    """When each arriving packet leaves: the pure part of the daemon (no sockets, injectable rng)."""

    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0  # probability in [0, 1]
    rng: random.Random = field(default_factory=random.Random)
    _queue: collections.deque = field(default_factory=collections.deque)  # (release_time, packet_id)
    _last_release: float = 0.0

    def arrive(self, packet_id: int, now: float) -> bool:
        """Schedule a packet; False when it is lost (the caller drops it)."""
        if self.loss > 0.0 and self.rng.random() < self.loss:
            return False
        sample = self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s > 0.0 else 0.0
        release = max(self._last_release, now + max(0.0, self.delay_s + sample))
        self._last_release = release
        self._queue.append((release, packet_id))
        return True

    def due(self, now: float) -> int | None:
        """Pop every packet due by `now`; the id of the last one (None when none is due)."""
        last = None
        while self._queue and self._queue[0][0] <= now:
            last = self._queue.popleft()[1]
        return last

    def next_release(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)


class _Stopped(Exception):
    pass


class DelayDaemon:
    """Serves one NFQUEUE with a LinkSchedule until SIGTERM/SIGINT."""

    def __init__(self, queue_num: int, schedule: LinkSchedule, maxlen: int = 65536, gso: bool = True) -> None:
        self.schedule = schedule
        self.queue = QueueSocket(queue_num, maxlen=maxlen, gso=gso)
        self.accepted_batches = 0
        self.dropped = 0

    def stop(self, *_: object) -> None:
        """Signal handler: raising is what interrupts a select() that would otherwise be retried."""
        raise _Stopped

    def serve(self) -> None:
        sched, q = self.schedule, self.queue
        try:
            while True:
                nxt = sched.next_release()
                timeout = None if nxt is None else max(0.0, nxt - time.monotonic())
                select.select([q], [], [], timeout)
                now = time.monotonic()
                for pid in q.recv_packet_ids():
                    if not sched.arrive(pid, now):
                        q.drop(pid)
                        self.dropped += 1
                last = sched.due(time.monotonic() + RELEASE_SLACK_S)
                if last is not None:
                    q.accept_upto(last)
                    self.accepted_batches += 1
        except _Stopped:
            pass
        finally:
            q.close()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testbed.delay_daemon", description=__doc__.split("\n")[0])
    p.add_argument("--queue", type=int, default=0, help="NFQUEUE number")
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform jitter +- this (never reorders)")
    p.add_argument("--loss-pct", type=float, default=0.0, help="packet loss probability, percent")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--maxlen", type=int, default=65536, help="kernel queue length, packets")
    p.add_argument("--per-packet", action="store_true",
                   help="queue wire-size packets, not whole GSO packets (exact loss, more CPU)")
    p.add_argument("--ready-file", type=Path, default=None, help="written once the queue is bound")
    p.add_argument("--tag", default="", help="free text naming the link (shows in ps and logs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s delay_daemon[{args.tag}] %(levelname)s %(message)s")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)  # timer precision on a busy box; best effort
    except OSError:
        pass
    schedule = LinkSchedule(args.delay_ms / 1e3, args.jitter_ms / 1e3, args.loss_pct / 100.0, random.Random(args.seed))
    daemon = DelayDaemon(args.queue, schedule, maxlen=args.maxlen, gso=not args.per_packet)
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    logger.info("queue %d bound: delay %.3f ms, jitter %.3f ms, loss %.3f %%%s", args.queue, args.delay_ms,
                args.jitter_ms, args.loss_pct, ", per packet" if args.per_packet else "")
    if args.ready_file is not None:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.rename(args.ready_file)
    daemon.serve()
    logger.info("stopped (%d batches accepted, %d packets dropped)", daemon.accepted_batches, daemon.dropped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
