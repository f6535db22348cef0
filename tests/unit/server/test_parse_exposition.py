"""`metrics.parse_exposition` reads a Prometheus text page with prometheus_client's parser: label values
with commas, escaped quotes, braces and backslashes, timestamps, sglang's `sglang:` names, and a real
registry's output round-trip; another series sharing the name's prefix is not mixed in."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sglang_pdd.server.metrics import parse_exposition

PAGE = r'''# HELP sglang_pdd_router_peer_in_flight This router's requests on each server
# TYPE sglang_pdd_router_peer_in_flight gauge
sglang_pdd_router_peer_in_flight{peer="http://md:1/?a=1,b=2",role="main"} 3.0
sglang_pdd_router_peer_in_flight{peer="say \"hi\", then {go}",role="relay"} 1.0
sglang_pdd_router_peer_in_flight{peer="back\\slash",role="relay"} 2.0
sglang_pdd_router_peer_in_flight_extra{role="main"} 99.0
sglang:num_running_reqs{engine_type="unified",model_name="m,1"} 4.0 1700000000000
sglang:num_running_reqs{engine_type="unified",model_name="m,1"} 1.0
'''


def test_label_values_with_commas_and_escaped_quotes():
    got = parse_exposition(PAGE, "sglang_pdd_router_peer_in_flight")
    assert got == {
        (("peer", "http://md:1/?a=1,b=2"), ("role", "main")): 3.0,
        (("peer", 'say "hi", then {go}'), ("role", "relay")): 1.0,
        (("peer", "back\\slash"), ("role", "relay")): 2.0,
    }


def test_sglang_names_timestamps_and_equal_labels_summed():
    assert parse_exposition(PAGE, "sglang:num_running_reqs") == {
        (("engine_type", "unified"), ("model_name", "m,1")): 5.0}
    assert parse_exposition(PAGE, "sglang:token_usage") == {}


def test_a_real_registry_round_trips():
    reg = CollectorRegistry()
    c = Counter("sglang_pdd_x", "x", ("path", "peer"), registry=reg)
    c.labels("main", 'a,b="c"').inc(7)
    c.labels("relay", "10.0.0.1:1").inc(2)
    h = Histogram("sglang_pdd_y_seconds", "y", ("pipeline",), buckets=(1.0,), registry=reg)
    h.labels("P->RLD->MD").observe(0.5)
    Gauge("sglang_pdd_z", "z", registry=reg).set(1.5)
    text = generate_latest(reg).decode()
    assert parse_exposition(text, "sglang_pdd_x_total") == {
        (("path", "main"), ("peer", 'a,b="c"')): 7.0, (("path", "relay"), ("peer", "10.0.0.1:1")): 2.0}
    assert parse_exposition(text, "sglang_pdd_y_seconds_bucket") == {
        (("le", "1.0"), ("pipeline", "P->RLD->MD")): 1.0, (("le", "+Inf"), ("pipeline", "P->RLD->MD")): 1.0}
    assert parse_exposition(text, "sglang_pdd_y_seconds_count") == {(("pipeline", "P->RLD->MD"),): 1.0}
    assert parse_exposition(text, "sglang_pdd_z") == {(): 1.5}


def test_a_malformed_sample_line_raises():
    with pytest.raises(ValueError):
        parse_exposition('sglang_pdd_z{role="main} 1\n', "sglang_pdd_z")


def test_a_line_separator_inside_a_label_value_is_not_a_new_line():
    text = 'sglang_pdd_z{peer="a\u2028b"} 2\nsglang_pdd_z{peer="c"} 1\n'
    assert parse_exposition(text, "sglang_pdd_z") == {(("peer", "a\u2028b"),): 2.0, (("peer", "c"),): 1.0}
