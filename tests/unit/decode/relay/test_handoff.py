"""RelayDecode's handoff state machine (decode/relay/handoff.py), driven through a fake channel and a
fake clock: what it hands over and when, finishes, rejects, and catch-up chunks. MD's side:
tests/unit/decode/main/test_handoff.py."""

import pytest

from sglang_pdd.decode.relay.handoff import RelayHandoff
from sglang_pdd.protocol.messages import Finished, Ready, Reject, Tokens, Watch
from tests.fakes.clock import FakeClock
from tests.fakes.handoff import FakeChannel, FakeReason, FakeReq


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

    def finish_with_handoff(self, req, handoff_tokens, mode="one-shot"):
        self.handed.append((req.rid, handoff_tokens))
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
