"""The delay daemon's schedule (pure: no sockets, no root): delay, jitter without reordering, loss."""

from __future__ import annotations

import random

import pytest

from sglang_pdd.lab.testbed.delay_daemon import LinkSchedule


def test_each_packet_leaves_after_the_delay_and_not_before():
    s = LinkSchedule(delay_s=0.020)
    for i, t in enumerate((0.0, 0.001, 0.005)):
        assert s.arrive(i, t)
    assert s.due(0.0199) is None
    assert s.due(0.0200) == 0
    assert s.due(0.0210) == 1
    assert s.next_release() == pytest.approx(0.025)
    assert s.due(1.0) == 2
    assert len(s) == 0 and s.next_release() is None


def test_due_returns_the_last_id_of_the_released_prefix():
    s = LinkSchedule(delay_s=0.010)
    for i in range(5):
        s.arrive(100 + i, i * 0.001)
    assert s.due(0.0125) == 102  # ids 100..102 are due: one batch verdict "accept <= 102"
    assert len(s) == 2


def test_jitter_varies_the_delay_but_never_reorders():
    s = LinkSchedule(delay_s=0.010, jitter_s=0.004, rng=random.Random(1))
    arrivals = [i * 0.0005 for i in range(2000)]
    for i, t in enumerate(arrivals):
        s.arrive(i, t)
    releases = [r for r, _ in s._queue]
    ids = [pid for _, pid in s._queue]
    assert ids == sorted(ids)
    assert all(b >= a for a, b in zip(releases, releases[1:]))
    delays = [r - t for r, t in zip(releases, arrivals)]
    assert min(delays) >= 0.006 - 1e-9
    assert max(delays) <= 0.014 + 1e-9
    assert max(delays) - min(delays) > 0.004  # the jitter shows


def test_sparse_packets_see_the_full_jitter_range():
    s = LinkSchedule(delay_s=0.010, jitter_s=0.004, rng=random.Random(2))
    delays = []
    for i in range(500):
        t = i * 1.0  # far apart: the no-reordering rule never binds
        s.arrive(i, t)
        delays.append(s._queue[-1][0] - t)
    assert min(delays) < 0.0065 and max(delays) > 0.0135
    assert sum(delays) / len(delays) == pytest.approx(0.010, abs=0.0005)


def test_loss_drops_about_the_configured_fraction():
    s = LinkSchedule(delay_s=0.001, loss=0.2, rng=random.Random(3))
    kept = sum(s.arrive(i, 0.0) for i in range(5000))
    assert 0.77 * 5000 < kept < 0.83 * 5000
    assert len(s) == kept


def test_no_loss_keeps_every_packet():
    s = LinkSchedule(delay_s=0.001)
    assert all(s.arrive(i, 0.0) for i in range(1000))
