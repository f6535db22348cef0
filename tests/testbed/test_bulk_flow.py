"""The background bulk flow (testbed/bulk_flow.py): it loads the link, its bytes are counted apart
from everything else on the link, and it leaves nothing behind (root; skipped otherwise)."""

from __future__ import annotations

import time

import pytest

from sglang_pdd.lab.testbed import Testbed
from sglang_pdd.lab.testbed.bulk_flow import BulkFlow
from sglang_pdd.lab.testbed.probe import upload

MB = 1 << 20


def _wait_bytes(flow: BulkFlow, key: str, at_least: int, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = flow.wire_bytes()
        if got[key] >= at_least:
            return got
        assert time.monotonic() < deadline, f"the flow carried only {got} in {timeout_s:g} s"
        time.sleep(0.1)


def _rules(tb: Testbed, side: str) -> str:
    return tb.ns(side).run(["iptables", "-w", "-t", "raw", "-S"], check=False).stdout


def test_the_flow_is_counted_apart_and_takes_its_share_of_the_link(wan_testbed: Testbed, wan_probe_port: int):
    tb = wan_testbed
    flow = BulkFlow(tb, "A", "B", port=45011).start()
    try:
        f0, l0 = flow.wire_bytes(), tb.link_bytes()
        f1 = _wait_bytes(flow, "A->B", f0["A->B"] + 8 * MB)
        l1 = tb.link_bytes()
        # nothing else crossed in between: the rules' count is the link's (headers included)
        for k in ("A->B", "B->A"):
            assert abs((f1[k] - f0[k]) - (l1[k] - l0[k])) <= 0.02 * (l1[k] - l0[k]) + 64 * 1024, (k, f1, f0, l1, l0)
        assert f1["B->A"] - f0["B->A"] < 0.1 * (f1["A->B"] - f0["A->B"])  # ACKs only come back
        # another flow the same way gets a share of the line, not the line (it gets ~0.96 x 100 alone,
        # tests/testbed/test_wan_link.py)
        t = tb.ns("A").call(upload, tb.addr("B"), wan_probe_port, 8 * MB, timeout=60)
        assert t.nbytes == 8 * MB and t.mbit_second_half <= 0.75 * 100, t
        pids = flow.pids()
        assert len(pids) == 2
    finally:
        flow.stop()
    assert "45011" not in _rules(tb, "A") + _rules(tb, "B")
    assert all(not _alive(p) for p in pids)


def test_a_paced_flow_stays_under_its_pace(wan_testbed: Testbed):
    tb = wan_testbed
    with BulkFlow(tb, "B", "A", port=45012, pace_mbit=20.0) as flow:
        f0 = _wait_bytes(flow, "B->A", 1)
        t0 = time.monotonic()
        f1 = _wait_bytes(flow, "B->A", f0["B->A"] + 4 * MB)
        mbit = (f1["B->A"] - f0["B->A"]) * 8 / (time.monotonic() - t0) / 1e6
    assert mbit <= 20.0 * 1.15, f"a flow paced at 20 Mbit/s carried {mbit:.1f}"


def test_src_and_dst_must_differ(wan_testbed: Testbed):
    with pytest.raises(ValueError, match="src and dst"):
        BulkFlow(wan_testbed, "A", "A")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
