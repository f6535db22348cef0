"""policy.busy_fraction: the recent busy share of an instance, from its running busy-time counter."""

import math

import pytest

from sglang_pdd.policy.busy_fraction import BusyFraction


def test_the_first_sample_is_only_the_baseline():
    b = BusyFraction(tau_s=5.0)
    assert b.sample(100.0, 40.0) == 0.0  # 40 s busy before we looked says nothing of the recent past
    assert b.sample(105.0, 45.0) == pytest.approx(1 - math.exp(-1))  # busy all 5 s since: one tau's weight


def test_a_steady_share_is_learned_whatever_the_sample_spacing():
    b = BusyFraction(tau_s=2.0)
    t = busy = 0.0
    b.sample(t, busy)
    for i in range(400):
        dt = 0.05 + (i % 7) * 0.1  # irregular: the simulator samples at arrivals
        t, busy = t + dt, busy + 0.6 * dt
        b.sample(t, busy)
    assert b.fraction == pytest.approx(0.6)


def test_the_estimate_forgets_at_the_time_constant():
    b = BusyFraction(tau_s=1.0)
    b.sample(0.0, 0.0)
    b.sample(50.0, 50.0)  # busy throughout
    assert b.fraction == pytest.approx(1.0)
    b.sample(51.0, 50.0)  # then one tau idle
    assert b.fraction == pytest.approx(math.exp(-1))


def test_counters_ahead_of_the_clock_are_clamped_and_a_stale_sample_ignored():
    b = BusyFraction(tau_s=1.0)
    b.sample(0.0, 0.0)
    b.sample(0.5, 3.0)  # a step's whole duration is counted when it starts
    assert 0.0 < b.fraction <= 1.0
    before = b.fraction
    assert b.sample(0.5, 4.0) == before  # no time passed: nothing learned


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_a_non_positive_time_constant_is_refused(tau):
    with pytest.raises(ValueError):
        BusyFraction(tau_s=tau)
