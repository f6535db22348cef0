"""The faults: the WAN cut (an iptables DROP of everything arriving on each side's `wan0`), healed,
flapped; a server SIGKILLed; the connection-tracking table flushed.

The DROP rule goes first in the raw table's PREROUTING, ahead of the testbed's NFQUEUE rule, in both
namespaces: nothing crosses in either direction, and established TCP connections stall (they are not
reset) until the rule goes.
"""

from __future__ import annotations

import os
import shutil
import signal

from sglang_pdd.lab.testbed.link import IFNAME

DROP = ["PREROUTING", "-i", IFNAME, "-j", "DROP"]
SIDES = ("A", "B")


def cut_wan(tb) -> None:
    for side in SIDES:
        if not _has_drop(tb, side):
            tb.ns(side).run(["iptables", "-w", "-t", "raw", "-I", *DROP[:1], "1", *DROP[1:]])


def heal_wan(tb) -> None:
    for side in SIDES:
        while _has_drop(tb, side):
            tb.ns(side).run(["iptables", "-w", "-t", "raw", "-D", *DROP])


def wan_cut(tb) -> bool:
    """Whether a cut is in place on either side."""
    return any(_has_drop(tb, s) for s in SIDES)


def _has_drop(tb, side: str) -> bool:
    return tb.ns(side).run(["iptables", "-w", "-t", "raw", "-C", *DROP], check=False).returncode == 0


def flush_conntrack(tb) -> str:
    """`conntrack -F` in both namespaces; what was done (the tool may be missing)."""
    if shutil.which("conntrack") is None:
        return "conntrack not installed: no flush (no testbed rule matches on connection state)"
    for side in SIDES:
        tb.ns(side).run(["conntrack", "-F"], check=False)
    return "conntrack -F in both namespaces"


def sigkill(server) -> None:
    """SIGKILL a server's process group (its scheduler and detokenizer too)."""
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait()
