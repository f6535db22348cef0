"""The WAN link model: timing, fair sharing, cancellation, byte accounting, monotonicity."""

import numpy as np
import pytest

from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.wan import WanLink, WanSpec


def _run(spec, transfers, cancel_at=None):
    """transfers: list of (start_s, bytes). Returns completion times (None if cancelled)."""
    loop = EventLoop()
    link = WanLink(loop, spec)
    done = [None] * len(transfers)
    handles = {}

    def start(i, nbytes):
        handles[i] = link.start(nbytes, lambda tr, i=i: done.__setitem__(i, loop.now))

    for i, (t, b) in enumerate(transfers):
        loop.at(t, start, i, b)
    for i, t in (cancel_at or {}).items():
        loop.at(t, lambda i=i: link.cancel(handles[i]))
    loop.run()
    return done, link


def test_single_transfer_takes_bytes_over_bandwidth_plus_rtt():
    spec = WanSpec(bandwidth_gbps=8.0, rtt_s=0.05, jitter=0.0)
    (t,), link = _run(spec, [(0.0, 1e9)])
    assert t == pytest.approx(1e9 / 1e9 + 0.05)
    assert link.bytes_sent == pytest.approx(1e9)


def test_concurrent_transfers_share_fairly():
    spec = WanSpec(bandwidth_gbps=8.0, rtt_s=0.0, jitter=0.0)
    (a, b), _ = _run(spec, [(0.0, 1e9), (0.0, 1e9)])
    assert a == pytest.approx(2.0) and b == pytest.approx(2.0)
    (small, big), _ = _run(spec, [(0.0, 0.5e9), (0.0, 2e9)])
    assert small == pytest.approx(1.0)  # half rate while both run
    assert big == pytest.approx(2.5)  # full rate afterwards


def test_per_flow_cap_limits_a_lone_transfer():
    spec = WanSpec(bandwidth_gbps=8.0, rtt_s=0.0, jitter=0.0, per_flow_gbps=2.0)
    (t,), _ = _run(spec, [(0.0, 1e9)])
    assert t == pytest.approx(4.0)


def test_cancel_frees_bandwidth_and_counts_only_sent_bytes():
    spec = WanSpec(bandwidth_gbps=8.0, rtt_s=0.0, jitter=0.0)
    (a, b), link = _run(spec, [(0.0, 1e9), (0.0, 4e9)], cancel_at={1: 1.0})
    assert b is None
    assert a == pytest.approx(1.5)  # 0.5e9 in the first second, then the whole link
    assert link.bytes_sent == pytest.approx(1e9 + 0.5e9)


def test_more_bandwidth_never_delays_any_transfer():
    rng = np.random.default_rng(0)
    transfers = [(float(t), float(b)) for t, b in zip(np.sort(rng.uniform(0, 20, 40)),
                                                      rng.lognormal(20, 1.5, 40))]
    prev = None
    for gbps in (5, 10, 25, 50, 100):
        done, _ = _run(WanSpec(bandwidth_gbps=gbps, rtt_s=0.03, jitter=0.0), transfers)
        if prev is not None:
            assert all(d <= p + 1e-9 for d, p in zip(done, prev))
        prev = done


def test_jitter_is_seeded_and_bounded():
    spec = WanSpec(bandwidth_gbps=10.0, jitter=0.3, seed=5)
    loop = EventLoop()
    l1, l2 = WanLink(loop, spec), WanLink(loop, spec)
    caps = [l1.capacity(t) for t in np.arange(0, 50, 0.5)]
    assert caps == [l2.capacity(t) for t in np.arange(0, 50, 0.5)]
    assert min(caps) >= 0.1 * spec.bytes_per_s and len(set(caps)) > 10
    (t,), _ = _run(spec, [(0.0, 5e9)])
    assert t > 0
