"""MainDecode's handoff state machine (decode/main/handoff.py), driven through a fake channel and a
fake clock: admission, the KV landing, the relay's tokens (one-shot and catch-up), bad replies and
timeouts. RLD's side: tests/unit/decode/relay/test_handoff.py; the table's leaks: test_leaks.py."""

import pytest

from sglang_pdd.decode.main.handoff import ADMITTED, READY, WAITING_TOKENS, MainHandoff
from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch
from sglang_pdd.protocol.request import RequestParams
from tests.fakes.clock import FakeClock
from tests.fakes.handoff import FakeChannel, FakeReq

RELAY = "tcp://rld:1"


def main(timeout=5.0, keep_kv=True, mode="one-shot", chunk=32):
    ch, clock = FakeChannel(), FakeClock()
    return MainHandoff(ch, timeout_s=timeout, now=clock, keep_kv_when_relay_finishes=keep_kv, mode=mode,
                       chunk=chunk), ch, clock


def admitted(h, rid="m", room=7):
    req = FakeReq(rid, 1000 + room, output_ids=[5])
    h.admit(req, RequestParams(v=1, relay_room=room, relay=RELAY))
    return req


def test_main_watches_at_admission_asks_when_kv_lands_and_extends_on_tokens():
    h, ch, _ = main()
    req = admitted(h)
    assert ch.sent == [(RELAY, Watch(room=7))] and h.held() == []
    h.kv_arrived(req)
    assert ch.sent[-1] == (RELAY, Ready(room=7)) and h.held() == [req]
    ch.inbox = [(RELAY, Tokens(room=7, ids=[5, 6, 7]))]
    assert h.poll() == []
    (p,) = h.take_ready(max_reqs=8, slot_budget=100)
    assert p.req is req and p.tokens == [5, 6, 7]
    assert h.held() == [] and not h.is_relayed(req)


def test_relay_finished_before_the_kv_landed_aborts_through_sglang_queues_in_abort_mode():
    h, ch, _ = main(keep_kv=False)
    req = admitted(h)
    ch.inbox = [(RELAY, Finished(room=7, reason="length", n_tokens=4))]
    (a,) = h.poll()
    assert a.req is req and not a.held and a.relay_finished and "length" in a.message


def test_relay_finished_before_the_kv_landed_lets_the_kv_land_and_keeps_it():
    h, ch, _ = main()
    req = admitted(h)
    ch.inbox = [(RELAY, Finished(room=7, reason="length", n_tokens=4))]
    assert h.poll() == [] and h.held() == []  # still in sglang's queues: the transfer goes on
    a = h.kv_arrived(req)
    assert a.req is req and a.held and a.relay_finished and "kept its KV" in a.message
    assert Ready(room=7) not in [m for _, m in ch.sent] and h.pending == {}


@pytest.mark.parametrize("reply, match", [
    (Reject(room=7, reason="unknown room"), "rejected the handoff: unknown room"),
    (Tokens(room=7, start=3, ids=[1], final=True), "expected one-shot tokens from 0"),
    (Tokens(room=7, start=0, ids=[1], final=False), "expected one-shot tokens from 0"),
    (Tokens(room=7, start=0, ids=[], final=True), "expected one-shot tokens from 0"),
])
def test_bad_replies_fail_the_held_request(reply, match):
    h, ch, _ = main()
    req = admitted(h)
    h.kv_arrived(req)
    ch.inbox = [(RELAY, reply)]
    (a,) = h.poll()
    assert a.held and not a.relay_finished and match in a.message
    assert h.stats.failed == 1 and h.pending == {}


def test_no_tokens_within_the_timeout_fails_the_request():
    h, ch, clock = main(timeout=5)
    req = admitted(h)
    h.kv_arrived(req)
    clock.t = 4
    assert h.poll() == []
    clock.t = 6
    (a,) = h.poll()
    assert a.req is req and "within 5s" in a.message


def test_messages_for_unknown_rooms_or_other_relays_are_counted_and_ignored():
    h, ch, _ = main()
    admitted(h)
    ch.inbox = [(RELAY, Tokens(room=99, ids=[1])), ("tcp://other:1", Tokens(room=7, ids=[1]))]
    assert h.poll() == [] and h.stats.unknown_messages == 2
    assert h.pending[(RELAY, 7)].state == ADMITTED


def test_take_ready_respects_rows_slots_and_solo_requests():
    h, ch, _ = main()
    reqs = [admitted(h, rid=f"r{i}", room=i) for i in range(4)]
    for r in reqs:
        h.kv_arrived(r)
    ch.inbox = [(RELAY, Tokens(room=i, ids=[1] * (i + 1))) for i in range(4)]
    h.poll()
    assert [p.req.rid for p in h.take_ready(max_reqs=2, slot_budget=100)] == ["r0", "r1"]
    assert h.take_ready(max_reqs=8, slot_budget=2) == []  # r2 needs 3 slots: it waits
    solo = {"r2"}
    got = h.take_ready(max_reqs=8, slot_budget=100, solo=lambda req: req.rid in solo)
    assert [p.req.rid for p in got] == ["r2"]
    assert [p.req.rid for p in h.take_ready(max_reqs=8, slot_budget=100)] == ["r3"]
    assert h.stats.handoffs == 4 and h.stats.extend_sizes == [2, 1, 1]


def test_drop_forgets_and_returns_held_requests_only():
    h, _, _ = main()
    a, b = admitted(h, "a", 1), admitted(h, "b", 2)
    h.kv_arrived(b)
    assert h.drop("a") is None and h.drop("b") is b and h.pending == {}
    assert h.pending.get((RELAY, 2)) is None
    assert WAITING_TOKENS and READY  # states exported for the runtime


# -- catch-up ---------------------------------------------------------------------------------

def test_main_catch_up_recomputes_chunks_then_takes_the_final_tokens():
    h, ch, _ = main(mode="catch-up", chunk=2)
    req = admitted(h)
    h.kv_arrived(req, md_batch=3)
    assert ch.sent[-1] == (RELAY, Ready(room=7, have=0, mode="catch-up", chunk=2, gap=2, md_batch=3))
    ch.inbox = [(RELAY, Tokens(room=7, start=0, ids=[5, 6], final=False, mode="catch-up"))]
    assert h.poll() == []
    assert h.take_ready(max_reqs=8, slot_budget=100) == []  # not final: not for the one-shot path
    (p,) = h.take_ready(max_reqs=8, slot_budget=100, final=False)
    assert p.tokens == [5, 6] and p.have == 0 and h.held() == [req] and h.is_relayed(req)
    assert h.take_ready(max_reqs=8, slot_budget=100, final=False) == []  # it is extending now
    h.chunk_done(p, md_batch=4)
    assert ch.sent[-1] == (RELAY, Ready(room=7, have=2, mode="catch-up", chunk=2, gap=2, md_batch=4))
    ch.inbox = [(RELAY, Tokens(room=7, start=2, ids=[7], final=True, mode="catch-up"))]
    assert h.poll() == []
    (p,) = h.take_ready(max_reqs=8, slot_budget=100)
    assert p.have == 2 and p.tokens == [7] and not h.is_relayed(req)
    assert h.stats.handoff_tokens == 3 and h.stats.chunks == 1 and h.stats.modes == {"catch-up": 1}


def test_main_fails_tokens_that_skip_or_repeat_what_it_recomputed():
    h, ch, _ = main(mode="catch-up", chunk=2)
    req = admitted(h)
    h.kv_arrived(req)
    ch.inbox = [(RELAY, Tokens(room=7, start=0, ids=[5, 6], final=False, mode="catch-up"))]
    h.poll()
    (p,) = h.take_ready(max_reqs=8, slot_budget=100, final=False)
    h.chunk_done(p)
    ch.inbox = [(RELAY, Tokens(room=7, start=1, ids=[6, 7], final=True, mode="catch-up"))]
    (a,) = h.poll()
    assert a.held and "expected catch-up tokens from 2" in a.message


def test_request_params_override_the_servers_handoff_mode():
    h, ch, _ = main(mode="one-shot")
    req = FakeReq("m", 1007, output_ids=[5])
    h.admit(req, RequestParams(v=1, relay_room=7, relay=RELAY, handoff="catch-up", chunk=4))
    h.kv_arrived(req)
    assert ch.sent[-1] == (RELAY, Ready(room=7, have=0, mode="catch-up", chunk=4, gap=2))
