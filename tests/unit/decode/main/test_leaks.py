"""Nothing stays in MainDecode's handoff table: every state has a deadline and an abort path, an
AbortReq (one rid or abort_all) reaches every state, and the idle check counts every state."""

import pytest

from sglang_pdd.decode.main.handoff import ADMITTED, DRAINING, EXTENDING, READY, STATES, WAITING_TOKENS, MainHandoff
from sglang_pdd.protocol.messages import Finished, Tokens
from sglang_pdd.protocol.request import RequestParams
from tests.fakes.clock import FakeClock
from tests.fakes.handoff import FakeChannel, FakeReason, FakeReq

RELAY = "tcp://rld:1"
KV_TIMEOUT, TIMEOUT = 30.0, 5.0


def main():
    ch, clock = FakeChannel(), FakeClock()
    return MainHandoff(ch, timeout_s=TIMEOUT, now=clock, kv_timeout_s=KV_TIMEOUT, mode="catch-up"), ch, clock


def admit(h, i):
    req = FakeReq(f"rid-{i}", 1000 + i, output_ids=[5])
    assert h.admit(req, RequestParams(v=1, relay_room=i, relay=RELAY)) is None
    return req


def idle(h) -> bool:
    return h.pending == {} and h.by_rid == {} and set(h.counts().values()) == {0}


def to_state(h, ch, req, i, state):
    if state == DRAINING:
        ch.inbox = [(RELAY, Finished(room=i, reason="length"))]
        assert h.poll() == []
    if state in (WAITING_TOKENS, READY, EXTENDING):
        h.kv_arrived(req)
    if state in (READY, EXTENDING):
        ch.inbox = [(RELAY, Tokens(room=i, ids=[5, 6], final=state == READY))]
        assert h.poll() == []
    if state == EXTENDING:
        (p,) = h.take_ready(8, 1000, final=False)
        assert p.req is req
    assert h.pending[(RELAY, i)].state == state


@pytest.mark.parametrize("state", [ADMITTED, DRAINING])
def test_a_request_whose_kv_never_lands_is_aborted_through_sglang_at_the_kv_deadline(state):
    h, ch, clock = main()
    req = admit(h, 1)
    to_state(h, ch, req, 1, state)
    clock.t = KV_TIMEOUT - 1
    assert h.poll() == [] and h.counts()[state] == 1
    clock.t = KV_TIMEOUT + 1
    (a,) = h.poll()
    assert a.req is req and not a.held and "KV did not arrive within 30s" in a.message
    assert idle(h)


def test_a_ready_request_that_never_gets_room_for_its_extend_fails_at_the_deadline():
    h, ch, clock = main()
    req = admit(h, 1)
    to_state(h, ch, req, 1, READY)
    clock.t += TIMEOUT + 1
    (a,) = h.poll()
    assert a.req is req and a.held and "no room for the handoff EXTEND" in a.message
    assert idle(h)


@pytest.mark.parametrize("state", [ADMITTED, DRAINING])
def test_an_entry_whose_request_sglang_ended_is_forgotten(state):
    h, ch, _ = main()
    req = admit(h, 1)
    to_state(h, ch, req, 1, state)
    req.finished_reason = FakeReason("abort")  # e.g. the transfer failed in sglang's queues
    assert h.poll() == [] and idle(h) and h.stats.ended_by_sglang == 1


def test_abort_all_and_one_rid_match_every_state():
    h, ch, _ = main()
    reqs = {state: admit(h, i) for i, state in enumerate(STATES)}
    for i, (state, req) in enumerate(reqs.items()):
        to_state(h, ch, req, i, state)
    assert h.counts() == dict.fromkeys(STATES, 1)
    assert {p.req.rid for p in h.matching("", abort_all=True)} == {r.rid for r in reqs.values()}
    assert [p.req for p in h.matching("rid-1")] == [reqs[STATES[1]]]
    assert h.matching("") == []  # an empty rid without abort_all names nothing


class Runtime:
    """MainRuntime's abort and idle paths over a MainHandoff, without a scheduler."""

    def __init__(self, h):
        from sglang_pdd.decode.main.runtime import MainRuntime

        self.rt = MainRuntime.__new__(MainRuntime)
        self.rt.handoff, self.rt.last_extend, self.rt._held_published, self.rt._chunks = h, None, -1, {}
        self.ended = []
        self.rt._abort = lambda a, keep_kv=True: self.ended.append(a)


def test_fifty_clients_gone_before_their_kv_landed_leave_the_table_empty_and_main_idle():
    h, ch, _ = main()
    r = Runtime(h)
    reqs = [admit(h, i) for i in range(50)]
    assert r.rt.busy() and h.held() == []  # invisible to held(), still counted by the idle check
    for req in reqs:  # sglang's abort_request ended each in its queues; the hook runs after it
        r.rt.on_abort_request(req.rid, None)
    assert idle(h) and not r.rt.busy() and r.ended == []


def test_abort_all_ends_held_requests_and_forgets_the_others():
    h, ch, _ = main()
    r = Runtime(h)
    reqs = {state: admit(h, i) for i, state in enumerate(STATES)}
    for i, (state, req) in enumerate(reqs.items()):
        to_state(h, ch, req, i, state)
    r.rt.on_abort_request("", None, abort_all=True)
    assert idle(h)
    assert sorted(a.req.rid for a in r.ended) == sorted(reqs[s].rid for s in (WAITING_TOKENS, READY, EXTENDING))
    assert all(a.held and not a.relay_finished for a in r.ended)


def test_the_table_is_published_by_state_with_zeros(monkeypatch):
    from sglang_pdd.server import metrics

    h, ch, _ = main()
    admit(h, 1)
    seen = {}
    monkeypatch.setattr(metrics, "set_handoff_requests", lambda role, counts: seen.update({role: counts}))
    monkeypatch.setattr(metrics, "set_held", lambda role, n: None)
    r = Runtime(h)
    r.rt.publish()
    assert seen == {"main": {**dict.fromkeys((s.value for s in STATES), 0), "admitted": 1}}


def test_messages_for_unknown_rooms_are_counted_and_logged_sparingly(caplog):
    h, ch, _ = main()
    ch.inbox = [(RELAY, Tokens(room=1000 + i, ids=[1])) for i in range(100)]
    with caplog.at_level("WARNING", logger="sglang_pdd.decode.main.handoff"):
        assert h.poll() == []
    assert h.stats.unknown_messages == 100
    assert len([r for r in caplog.records if "unknown or finished room" in r.getMessage()]) == 7  # 1, 2, 4.. 64
