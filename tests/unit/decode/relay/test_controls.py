"""RLD's test control (decode/relay/controls.py): `relay_min_eager` is a `hold` the controlled runtime
hands the handoff state machine, read per request when the relay admits it; the plain runtime holds
nothing back."""

import json

from sglang_pdd.decode.relay.controls import MIN_EAGER_ATTR, ControlledRelayRuntime, below_min_eager
from sglang_pdd.decode.relay.handoff import RelayHandoff, no_hold
from sglang_pdd.protocol.messages import Ready, Tokens
from sglang_pdd.test_switches import TestSwitches
from tests.fakes.clock import FakeClock
from tests.fakes.handoff import FakeChannel, FakeReason, FakeReq


class DecodingOps:
    """`RelayOps` of a relay on which every request is decoding."""

    def __init__(self):
        self.handed: list = []

    def is_decoding(self, req):
        return True

    def output_logprobs(self, req, start, end):
        return None

    def load(self):
        return 1, 0.1

    def finish_with_handoff(self, req, handoff_tokens, mode="one-shot"):
        self.handed.append((req.rid, handoff_tokens))
        req.finished_reason = FakeReason("pdd_handoff")


def test_below_min_eager_holds_a_request_until_it_has_its_tokens():
    req = FakeReq("a", 7, output_ids=[1, 2])
    assert not below_min_eager(req) and not no_hold(req)  # admitted without the knob: never held
    setattr(req, MIN_EAGER_ATTR, 3)
    assert below_min_eager(req)
    req.output_ids.append(3)
    assert not below_min_eager(req)


def test_a_held_ready_is_answered_at_exactly_min_eager_tokens():
    """MD's Ready came first: the state machine answers it at the first poll the hold lets go, k == 3."""
    ch = FakeChannel()
    h = RelayHandoff(ch, timeout_s=5.0, now=FakeClock(), hold=below_min_eager)
    req = FakeReq("a", 7, output_ids=[5])
    setattr(req, MIN_EAGER_ATTR, 3)
    h.track(req)
    ch.inbox = [(b"md", Ready(room=7))]
    ops = DecodingOps()
    for token in (6, 7):
        h.poll(ops)
        assert ops.handed == [] and ch.sent == []
        req.output_ids.append(token)
    h.poll(ops)
    assert ops.handed == [("a", 3)]
    assert ch.sent == [(b"md", Tokens(room=7, start=0, ids=[5, 6, 7], final=True))]


def controlled(switches: TestSwitches) -> ControlledRelayRuntime:
    """The controlled runtime's admission, without a scheduler or a channel."""
    rt = ControlledRelayRuntime.__new__(ControlledRelayRuntime)
    rt.switches = switches
    rt.handoff = RelayHandoff(FakeChannel(), timeout_s=5.0, now=FakeClock(), hold=below_min_eager)
    return rt


def test_the_knob_is_read_when_a_request_is_admitted(tmp_path):
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"relay_min_eager": 3}))
    rt = controlled(TestSwitches(knobs_file=str(knobs)))
    first, second = FakeReq("a", 7), FakeReq("b", 8)
    rt.admit(first)
    knobs.write_text(json.dumps({"relay_min_eager": 5}))  # a test changes it while the server runs
    rt.admit(second)
    assert getattr(first, MIN_EAGER_ATTR) == 3 and getattr(second, MIN_EAGER_ATTR) == 5
    assert rt.handoff.rooms[7].req is first and rt.handoff.rooms[8].req is second


def test_without_a_knobs_file_nothing_is_held():
    rt = controlled(TestSwitches(testing=True))  # SGLANG_PDD_TESTING alone: no knobs to read
    req = FakeReq("a", 7)
    rt.admit(req)
    assert getattr(req, MIN_EAGER_ATTR) == 0 and not below_min_eager(req)
