"""LinkConfig validation and the derived tbf parameters."""

from __future__ import annotations

import pytest

from sglang_pdd.lab.testbed.config import LinkConfig
from sglang_pdd.lab.testbed.link import subnet_hosts, tbf_args
from sglang_pdd.lab.testbed.state import check_prefix


@pytest.mark.parametrize(
    "kwargs",
    [dict(delay_ms=-1), dict(jitter_ms=-1), dict(delay_ms=2, jitter_ms=3), dict(rate_mbit=-5),
     dict(loss_pct=100), dict(loss_pct=-1), dict(backend="ifb")],
)
def test_invalid_link_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        LinkConfig(**kwargs)


def test_config_round_trips_through_json():
    cfg = LinkConfig(delay_ms=10, jitter_ms=1, rate_mbit=1000, loss_pct=0.5, backend="nfqueue")
    assert LinkConfig.from_json(cfg.to_json()) == cfg
    assert cfg.rtt_ms == 20 and cfg.impaired and cfg.shaped


def test_rate_only_link_needs_no_delay_emulation():
    cfg = LinkConfig(delay_ms=0, rate_mbit=100)
    assert not cfg.impaired and cfg.shaped


def test_tbf_burst_holds_a_whole_gso_packet_and_queue_covers_the_delay():
    args = dict(zip(*[iter(tbf_args(100, 40))] * 2))
    assert args["rate"] == "100mbit"
    assert int(args["burst"]) >= 64 * 1024
    assert args["latency"] == "80ms"
    fast = dict(zip(*[iter(tbf_args(10000, 1))] * 2))
    assert int(fast["burst"]) == 10000 * 10**6 // 8 // 250


def test_subnet_gives_two_host_addresses():
    assert subnet_hosts("10.77.0.0/30") == ("10.77.0.1/30", "10.77.0.2/30")
    with pytest.raises(ValueError):
        subnet_hosts("10.77.0.1/32")


@pytest.mark.parametrize("bad", ["", "1abc", "a" * 30, "a b", "a/b"])
def test_prefix_must_make_valid_namespace_names(bad):
    with pytest.raises(ValueError):
        check_prefix(bad)
