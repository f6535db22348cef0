"""lab.micro.router_bench: the sizing fit (router CPU per request = a + b * chunks) and one small row
through a real router against fake roles streaming deltas, as examples/kubernetes starts RLD and MD."""

from __future__ import annotations

import sys

import pytest

from sglang_pdd.lab.micro import router_bench as rb


def test_the_fit_recovers_the_fixed_and_per_chunk_costs():
    a, b = 1.5e-3, 27e-6
    a_fit, b_fit = rb.fit_costs([(n, a + b * n) for n in (16, 256, 2048) for _ in range(3)])
    assert a_fit == pytest.approx(a) and b_fit == pytest.approx(b)


def test_the_fit_weighs_each_row_by_its_relative_error():
    # 10 % noise on the long row only: plain least squares would put `a` 25 % off (1.12 ms), from that row alone
    a, b = 1.5e-3, 27e-6
    a_fit, b_fit = rb.fit_costs([(16, a + b * 16), (256, a + b * 256), (2048, 1.1 * (a + b * 2048))])
    assert a_fit == pytest.approx(a, rel=0.1) and b_fit == pytest.approx(b, rel=0.2)


def test_the_fit_never_reports_a_negative_cost_and_needs_two_lengths():
    a, b = rb.fit_costs([(16, 1e-3), (2048, 0.5e-3)])  # falling with the output: noise
    assert b == 0.0 and 0.5e-3 < a < 1e-3
    assert rb.fit_costs([(16, 0.0), (2048, 2048e-6)])[0] == 0.0  # through the origin, not below it
    with pytest.raises(ValueError, match="two output lengths"):
        rb.fit_costs([(256, 1e-3), (256, 2e-3)])


def test_the_sizing_rows_vary_only_the_output_length():
    sizing = rb.rows(quick=True, scale=2, sizing=True)
    assert {(r.prompt, r.cache) for r in sizing} == {(1024, 0)} and len({r.output for r in sizing}) == 3
    assert set(sizing) < set(rb.rows(quick=True, scale=2))
    assert sizing[0].requests == 2 * rb.rows(quick=True, sizing=True)[0].requests  # --scale: more requests


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_row_streams_every_token_through_the_router_with_incremental_roles():
    r = rb.run_row(rb.Row(prompt=32, output=12, cache=0, requests=6), concurrency=3, incremental=True)
    assert r["chunks"] == 6 * 12  # one chunk per token, the handoff after RLD's 4 included
    assert r["streams_per_core_s"] > 0 and r["chunks_per_core_s"] == pytest.approx(12 * r["streams_per_core_s"])
    assert 0 < r["router_cpu_share"]
