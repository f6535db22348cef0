"""The room plan (protocol/room_plan.py): the bodies below are written out as the router's
dispatcher built them by hand before the plan existed (same keys, same values)."""

import pytest

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.protocol.room_plan import plan
from sglang_pdd.protocol.request import parse

R, R2 = 0x1234, 0x5678
SP = {"max_new_tokens": 8, "temperature": 0.0}
BODY = {"input_ids": [1, 2, 3], "sampling_params": SP, "stream": True}
BOOT = {"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998}
CHANNEL = "tcp://10.0.0.2:7100"


def routed(pipeline):
    return plan(BODY, pipeline, "10.0.0.1", 8998, CHANNEL, rooms=(R, R2), rid=f"pdd-{R:x}")


def test_p_md():
    p = routed(Pipeline.P_MD)
    assert (p.room, p.main_room) == (R, R2)
    assert list(p.bodies) == ["prefill", "main"]
    assert p.bodies == {
        "prefill": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-p"},
        "main": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-m"},
    }


def test_p_rld_md():
    p = routed(Pipeline.P_RLD_MD)
    assert list(p.bodies) == ["main", "prefill", "relay"]  # the order the dispatcher starts them in
    assert p.bodies == {
        "main": {**BODY, **BOOT, "bootstrap_room": R2, "rid": "pdd-1234-m",
                 "sampling_params": {**SP, "custom_params": {"pdd": {"v": 1, "relay_room": R, "relay": CHANNEL}}}},
        "prefill": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-p",
                    "sampling_params": {**SP, "custom_params": {"pdd": {"v": 1, "main_room": R2}}}},
        "relay": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-r"},
    }
    assert parse(p.bodies["main"]["sampling_params"]["custom_params"]).relay_room == R
    assert BODY["sampling_params"] == SP and "custom_params" not in SP  # the input is not touched


def test_p_rld_only():
    p = routed(Pipeline.P_RLD)
    assert list(p.bodies) == ["prefill", "relay"]
    assert p.bodies == {
        "prefill": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-p"},
        "relay": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-r"},
    }


def test_client_without_rid_with_main_params():
    """testing/pdd_client.py: no rids; extra MD parameters."""
    p = plan(BODY, Pipeline.P_RLD_MD, "10.0.0.1", 8998, CHANNEL, rooms=(R, R2), main_params={"handoff": "catch-up",
                                                                                          "chunk": 4})
    assert "rid" not in p.bodies["relay"] and p.bodies["relay"] == {**BODY, **BOOT, "bootstrap_room": R}
    assert p.bodies["main"]["sampling_params"]["custom_params"] == {
        "pdd": {"v": 1, "relay_room": R, "relay": CHANNEL, "handoff": "catch-up", "chunk": 4}}


def test_fanout_alone_tells_main_of_no_relay():
    """The fan-out e2e tests: MD is a plain decode, its body carries no PDD parameters."""
    p = plan(BODY, Pipeline.P_RLD_MD, "10.0.0.1", 8998, rooms=(R, R2))
    assert p.bodies["main"] == {**BODY, **BOOT, "bootstrap_room": R2}
    assert p.bodies["prefill"]["sampling_params"]["custom_params"] == {"pdd": {"v": 1, "main_room": R2}}
    with pytest.raises(ValueError):
        plan(BODY, Pipeline.P_RLD_MD, "10.0.0.1", 8998, main_params={"chunk": 4})


def test_rooms_are_drawn_when_not_given():
    a, b = plan(BODY, Pipeline.P_RLD_MD, "h", 1, CHANNEL), plan(BODY, Pipeline.P_RLD_MD, "h", 1, CHANNEL)
    assert 0 <= a.room < 2**63 and 0 <= a.main_room < 2**63 and (a.room, a.main_room) != (b.room, b.main_room)


def test_existing_custom_params_are_kept():
    body = {**BODY, "sampling_params": {**SP, "custom_params": {"other": 1}}}
    p = plan(body, Pipeline.P_RLD_MD, "h", 1, CHANNEL, rooms=(R, R2))
    assert p.bodies["prefill"]["sampling_params"]["custom_params"] == {"other": 1, "pdd": {"v": 1, "main_room": R2}}


def test_p_rld_md_relayed_on_p_itself():
    """A prefill that relays (--pdd-relay local): P and MD share room R; P's copy is the relay's stream."""
    p = plan(BODY, Pipeline.P_RLD_MD, "10.0.0.1", 8998, CHANNEL, rooms=(R, R2), rid=f"pdd-{R:x}", relay_here=True)
    assert list(p.bodies) == ["main", "relay"] and (p.room, p.main_room) == (R, R)
    assert p.bodies == {
        "main": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-m",
                 "sampling_params": {**SP, "custom_params": {"pdd": {"v": 1, "relay_room": R, "relay": CHANNEL}}}},
        "relay": {**BODY, **BOOT, "bootstrap_room": R, "rid": "pdd-1234-r",
                  "sampling_params": {**SP, "custom_params": {"pdd": {"v": 1, "relay_here": True}}}},
    }
    with pytest.raises(ValueError, match="only P->RLD->MD"):
        plan(BODY, Pipeline.P_MD, "10.0.0.1", 8998, CHANNEL, relay_here=True)
    with pytest.raises(ValueError, match="token channel"):
        plan(BODY, Pipeline.P_RLD_MD, "10.0.0.1", 8998, None, relay_here=True)
