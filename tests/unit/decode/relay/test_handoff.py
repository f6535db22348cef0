"""The RLD and MD handoff state machines, driven through a fake channel and a fake clock."""

import pytest

from sglang_pdd.decode.main.handoff import ADMITTED, READY, WAITING_TOKENS, MainHandoff
from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch
from sglang_pdd.protocol.request import RequestParams
from sglang_pdd.decode.relay.handoff import RelayHandoff

from tests.fakes.clock import FakeClock
from tests.fakes.handoff import FakeChannel, FakeReason, FakeReq

RELAY = "tcp://rld:1"
Clock = FakeClock  # the name test_main_leaks.py imports it by from here, with RELAY and the fakes


class FakeOps:
    def __init__(self, decoding=(), running=1, kv_usage=0.1):
        self.decoding = set(decoding)
        self.handed: list = []
        self.running, self.kv_usage = running, kv_usage

    def is_decoding(self, req):
        return req.rid in self.decoding

    def output_logprobs(self, req, start, end):
        return None

    def load(self):
        return self.running, self.kv_usage

    def finish_with_handoff(self, req, k, mode="one-shot"):
        self.handed.append((req.rid, k))
        req.finished_reason = FakeReason("pdd_handoff")


# -- RelayDecode -----------------------------------------------------------------------------

def relay(timeout=5.0):
    ch, clock = FakeChannel(), FakeClock()
    return RelayHandoff(ch, timeout_s=timeout, now=clock), ch, clock


def test_relay_hands_over_exactly_the_tokens_it_produced_once_decoding():
    h, ch, _ = relay()
    req = FakeReq("a", 7, output_ids=[5, 6, 7])
    h.track(req)
    ch.inbox = [(b"md", Ready(room=7))]
    ops = FakeOps()
    h.poll(ops)
    assert ch.sent == [] and ops.handed == []  # not decoding yet: the Ready waits
    ops.decoding.add("a")
    h.poll(ops)
    assert ops.handed == [("a", 3)]
    assert ch.sent == [(b"md", Tokens(room=7, start=0, ids=[5, 6, 7], final=True))]
    assert h.rooms == {}


def test_relay_that_finishes_first_tells_the_watching_main():
    h, ch, _ = relay()
    req = FakeReq("a", 7, output_ids=[1, 2])
    h.track(req)
    ch.inbox = [(b"md", Watch(room=7))]
    h.poll(FakeOps(decoding=["a"]))
    assert ch.sent == []
    req.finished_reason = FakeReason("length")
    h.poll(FakeOps())
    assert ch.sent == [(b"md", Finished(room=7, reason="length", n_tokens=2))]


def test_ready_for_a_finished_request_gets_finished_not_tokens():
    h, ch, _ = relay()
    req = FakeReq("a", 7, output_ids=[1], finished_reason=FakeReason("stop"))
    h.track(req)
    ch.inbox = [(b"md", Ready(room=7))]
    ops = FakeOps(decoding=["a"])
    h.poll(ops)
    assert ops.handed == [] and ch.sent == [(b"md", Finished(room=7, reason="stop", n_tokens=1))]


def test_unknown_room_is_rejected_after_the_timeout_and_forgotten():
    h, ch, clock = relay(timeout=5)
    ch.inbox = [(b"md", Ready(room=9))]
    h.poll(FakeOps())
    assert ch.sent == []
    clock.t = 6
    h.poll(FakeOps())
    assert ch.sent == [(b"md", Reject(room=9, reason="unknown room"))]
    assert h.rooms == {}


def test_relay_rejects_messages_only_main_may_receive():
    h, ch, _ = relay()
    ch.inbox = [(b"x", Tokens(room=1, ids=[1]))]
    h.poll(FakeOps())
    assert isinstance(ch.sent[0][1], Reject) and h.stats.rejected == 1


def test_finished_request_nobody_watches_is_forgotten_after_the_timeout():
    h, ch, clock = relay(timeout=5)
    h.track(FakeReq("a", 7, output_ids=[1], finished_reason=FakeReason("length")))
    h.poll(FakeOps())
    assert 7 in h.rooms
    clock.t = 6
    h.poll(FakeOps())
    assert h.rooms == {} and ch.sent == []


# -- MainDecode ------------------------------------------------------------------------------

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

def ready_at(relay_room, have, chunk=2, gap=1, mode="catch-up", md_batch=0):
    return Ready(room=relay_room, have=have, mode=mode, chunk=chunk, gap=gap, md_batch=md_batch)


def relay_decoding(output_ids: list[int], h=None, ch=None):
    """A relay whose request "a" (room 7) is decoding and has been asked for its first chunk."""
    if h is None:
        h, ch, _ = relay()
    req = FakeReq("a", 7, output_ids=output_ids)
    h.track(req)
    ops = FakeOps(decoding=["a"])
    ch.inbox = [(b"md", ready_at(7, 0))]
    h.poll(ops)
    return h, ch, req, ops


def test_relay_catch_up_sends_chunks_while_decoding_and_ends_when_the_gap_is_small():
    h, ch, req, ops = relay_decoding([1, 2, 3, 4, 5])
    assert ch.sent[-1] == (b"md", Tokens(room=7, start=0, ids=[1, 2], final=False, mode="catch-up"))
    assert ops.handed == [] and not req.finished()  # RLD keeps decoding
    h.poll(ops)
    assert len(ch.sent) == 1  # nothing more until MD asks again
    req.output_ids.append(6)
    ch.inbox = [(b"md", ready_at(7, 2))]
    h.poll(ops)
    assert ch.sent[-1] == (b"md", Tokens(room=7, start=2, ids=[3, 4], final=False, mode="catch-up"))
    ch.inbox = [(b"md", ready_at(7, 4))]
    h.poll(ops)
    assert ch.sent[-1][1].ids == [5, 6] and not ch.sent[-1][1].final  # gap 2 > 1: one more chunk
    ch.inbox = [(b"md", ready_at(7, 6))]
    h.poll(ops)
    assert len(ch.sent) == 3  # RLD has nothing new yet: the Ready waits
    req.output_ids.append(7)
    h.poll(ops)
    assert ch.sent[-1] == (b"md", Tokens(room=7, start=6, ids=[7], final=True, mode="catch-up"))
    assert ops.handed == [("a", 7)] and h.rooms == {}
    assert h.stats.chunks == 3 and h.stats.chunk_tokens == 6 and h.stats.modes == {("catch-up", "requested"): 1}


def test_relay_catch_up_goes_final_after_max_rounds():
    ch, clock = FakeChannel(), FakeClock()
    h, ch, req, ops = relay_decoding(list(range(10)), RelayHandoff(ch, timeout_s=5, now=clock, max_rounds=1), ch)
    ch.inbox = [(b"md", ready_at(7, 2))]
    h.poll(ops)
    assert ch.sent[-1][1].final and ch.sent[-1][1].ids == list(range(2, 10)) and ops.handed == [("a", 10)]


def test_relay_catch_up_that_does_not_converge_goes_final():
    h, ch, _ = relay()
    req = FakeReq("a", 7, output_ids=list(range(6)))
    h.track(req)
    ops = FakeOps(decoding=["a"])
    have = 0
    for _ in range(3):  # each round MD recomputes 2 tokens while RLD decodes 3
        ch.inbox = [(b"md", ready_at(7, have))]
        h.poll(ops)
        if ch.sent[-1][1].final:
            break
        have += len(ch.sent[-1][1].ids)
        req.output_ids.extend([9, 9, 9])
    msg = ch.sent[-1][1]
    assert msg.final and ops.handed == [("a", len(req.output_ids))] and h.stats.chunks == 2


def test_relay_rejects_a_ready_that_does_not_continue_what_it_sent():
    h, ch, req, ops = relay_decoding([1, 2, 3, 4, 5])
    ch.inbox = [(b"md", ready_at(7, 3))]  # it sent 2
    h.poll(ops)
    assert ch.sent[-1] == (b"md", Reject(room=7, reason="ready at 3 tokens, 2 were sent")) and h.rooms == {}


@pytest.mark.parametrize("running, usage, md_batch, eager, mode, label", [
    (1, 0.1, 20, 40, "catch-up", "md_busy"),
    (1, 0.1, 4, 40, "one-shot", "md_small_batch"),
    (1, 0.95, 20, 40, "one-shot", "rld_kv_busy"),
    (64, 0.1, 20, 40, "one-shot", "rld_busy"),
    (1, 0.1, 20, 8, "one-shot", "fits_one_chunk"),
])
def test_relay_adaptive_choice_reads_its_load_and_mains_batch(running, usage, md_batch, eager, mode, label):
    h, ch, _ = relay()
    h.track(FakeReq("a", 7, output_ids=list(range(eager))))
    ch.inbox = [(b"md", ready_at(7, 0, chunk=16, gap=2, mode="adaptive", md_batch=md_batch))]
    h.poll(FakeOps(decoding=["a"], running=running, kv_usage=usage))
    msg = ch.sent[-1][1]
    assert msg.mode == mode and msg.final == (mode == "one-shot")
    assert h.stats.modes == {(mode, label): 1} and h.stats.last_load.md_batch_size == md_batch


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
