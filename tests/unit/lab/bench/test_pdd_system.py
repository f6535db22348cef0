"""The bench tells the PDD router its preset's TTFT SLA where the router's policy decides."""

from types import SimpleNamespace

from sglang_pdd.lab.bench.pdd_system import Pdd, PddRelay, PddRelayOnly, router_link_args


def test_the_sla_reaches_the_router_of_an_auto_pipeline_only():
    assert router_link_args(object(), None, ttft_slo_s=2.0)[-2:] == ["--ttft-slo-secs", "2"]
    assert "--ttft-slo-secs" not in router_link_args(object(), None)
    dep = SimpleNamespace(ttft_slo_s=2.0)
    assert Pdd()._slo(dep) == 2.0
    assert PddRelay()._slo(dep) == 0.0  # --pipeline relay: no policy to read it
    assert PddRelayOnly()._slo(dep) == 0.0  # the router refuses it with --allow-relay-only
