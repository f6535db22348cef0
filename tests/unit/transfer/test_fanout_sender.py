"""FanoutSender contracts, with fake child senders (tests/fakes/fanout.py): what reaches the relay and
the main, when P may release the request's KV, and that the main leg never fails the request."""

import random

import numpy as np
import pytest

from sglang_pdd.transfer.fanout import FanoutContext, FanoutSender, MainState, Poll

from tests.fakes.clock import FakeClock
from tests.fakes.fanout import FakeChildSender, FakeRooms, FakeSlots, FakeTransferError

R, R2 = 111, 222
AUX = 3


def make(page_size=1, main_prefix=0, relay_prefix=0, timeout=30.0):
    relay, main = FakeChildSender(R, relay_prefix), FakeChildSender(R2, main_prefix)
    slots, rooms, clock = FakeSlots(), FakeRooms(), FakeClock(1000.0)
    ctx = FanoutContext(slots=slots, rooms=rooms, page_size=page_size, main_bootstrap_timeout=timeout, clock=clock)
    return FanoutSender(relay, main, ctx), relay, main, slots, rooms, clock


def bootstrap_relay(s, relay, num_pages):
    relay.bootstrap()
    assert s.poll() == Poll.WaitingForInput
    s.pop_decode_prefix_len()
    s.init(num_pages, AUX)


def pages(a, b):
    return np.arange(a, b, dtype=np.int32)


def test_relay_gets_every_page_and_main_only_pages_past_its_prefix():
    s, relay, main, slots, rooms, _ = make(page_size=1, main_prefix=6)
    main.bootstrap()
    bootstrap_relay(s, relay, 10)
    s.send(pages(100, 104), num_kv_tokens=4)  # early cached-prefix chunk
    s.send(pages(104, 110), ["state"], num_kv_tokens=6)  # last chunk
    assert relay.pages() == list(range(100, 110)) and relay.lasts() == [False, True]
    assert main.total == 4 and main.pages() == list(range(106, 110))
    assert main.lasts() == [True] and main.sent[-1].aux == 10 and main.sent[-1].num_kv_tokens == 4
    assert main.sent[-1].state_indices == ["state"]
    assert slots.copies == [(AUX, 10, R2)]  # the main's metadata row names its own room


def test_main_bootstrapping_late_gets_the_logged_chunks_replayed_trimmed():
    s, relay, main, *_ = make(page_size=1, main_prefix=3)
    bootstrap_relay(s, relay, 8)
    s.send(pages(0, 5))
    s.send(pages(5, 8))
    assert relay.lasts() == [False, True] and main.sent == []
    main.bootstrap()
    assert s.poll() == Poll.Transferring
    assert main.pages() == [3, 4, 5, 6, 7] and main.lasts() == [False, True]


def test_page_size_16_skips_whole_pages():
    s, relay, main, *_ = make(page_size=16, main_prefix=32)
    main.bootstrap()
    bootstrap_relay(s, relay, 5)  # 80 tokens
    s.send(pages(0, 5))
    assert main.total == 3 and main.pages() == [2, 3, 4]


def test_main_caching_the_whole_prompt_gets_only_the_metadata_row():
    s, relay, main, slots, *_ = make(page_size=1, main_prefix=6)
    main.bootstrap()
    bootstrap_relay(s, relay, 6)
    s.send(pages(0, 6))
    assert main.total == 0 and [x.pages for x in main.sent] == [[]] and main.lasts() == [True]
    assert main.sent[0].aux is not None and slots.copies


@pytest.mark.parametrize("seed", range(40))
def test_main_is_last_exactly_once_on_the_relays_last_chunk(seed):
    rng = random.Random(seed)
    ps = rng.choice([1, 16])
    n = rng.randint(1, 40)
    prefix_pages = rng.randint(0, n)
    s, relay, main, *_ = make(page_size=ps, main_prefix=prefix_pages * ps)
    early = rng.random() < 0.5
    if early:
        main.bootstrap()
    bootstrap_relay(s, relay, n)
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, min(4, n - 1)))) if n > 1 else []
    bounds = [0] + cuts + [n]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        s.send(pages(a, b))
        if not early and i == len(bounds) // 2:
            main.bootstrap()
    if not main.sent:
        main.bootstrap()
    s.poll()
    assert relay.lasts().count(True) == 1 and relay.lasts()[-1]
    assert main.lasts().count(True) == 1 and main.lasts()[-1]
    assert main.pages() == list(range(prefix_pages, n))


def test_p_never_waits_for_the_mains_handshake():
    s, relay, main, *_ = make()
    relay.bootstrap()
    assert main.status == Poll.Bootstrapping
    assert s.poll() == Poll.WaitingForInput  # the scheduler may finalize the relay now
    s.pop_decode_prefix_len()
    s.init(4, AUX)
    s.send(pages(0, 4))
    assert relay.pages() == [0, 1, 2, 3] and relay.lasts() == [True]


def test_success_is_held_until_the_main_succeeds():
    s, relay, main, *_ = make(main_prefix=2)
    main.bootstrap()
    bootstrap_relay(s, relay, 4)
    s.send(pages(0, 4))
    relay.status = Poll.Success
    assert s.poll() == Poll.Transferring
    main.status = Poll.Success
    assert s.poll() == Poll.Success and s.main_outcome == "success"


def test_a_failed_main_does_not_fail_the_request_and_release_waits_for_its_write_in_flight():
    s, relay, main, slots, rooms, _ = make(main_prefix=2)
    main.bootstrap()
    bootstrap_relay(s, relay, 4)
    s.send(pages(0, 4))
    main.status = Poll.Failed  # e.g. the main decode aborted (ZMQ abort -> room Failed)
    rooms.in_flight[R2] = 1  # a worker is still writing from P's pages
    relay.status = Poll.Success
    assert s.poll() == Poll.Transferring
    rooms.in_flight[R2] = 0
    assert s.poll() == Poll.Success
    assert s.main_outcome.startswith("main transfer failed")
    s.clear()
    assert relay.cleared and main.cleared and slots.freed == [10] and rooms.released == [R2]


def test_a_main_that_never_bootstraps_is_given_up_after_the_timeout():
    s, relay, main, slots, rooms, clock = make(timeout=5.0)
    bootstrap_relay(s, relay, 4)
    s.send(pages(0, 4))
    relay.status = Poll.Success
    assert s.poll() == Poll.Transferring
    clock.t += 4.9
    assert s.poll() == Poll.Transferring
    clock.t += 0.2
    assert s.poll() == Poll.Success
    assert main.aborted and rooms.failed and rooms.failed[0][0] == R2 and "bootstrap" in rooms.failed[0][1]
    assert main.sent == [] and slots.copies == []


def test_relay_failure_fails_the_main_and_reports_failed_only_after_the_main_drained():
    s, relay, main, slots, rooms, _ = make(main_prefix=1)
    main.bootstrap()
    bootstrap_relay(s, relay, 4)
    s.send(pages(0, 2))
    rooms.in_flight[R2] = 1
    relay.status = Poll.Failed
    assert s.poll() == Poll.Transferring
    assert main.aborted and rooms.failed[0][0] == R2
    rooms.in_flight[R2] = 0
    assert s.poll() == Poll.Failed
    with pytest.raises(FakeTransferError):
        s.failure_exception()
    assert main.cleared and slots.freed == [10] and rooms.released == [R2]


def test_abort_releases_the_main_leg_once():
    s, relay, main, slots, rooms, _ = make(main_prefix=1)
    main.bootstrap()
    bootstrap_relay(s, relay, 4)
    s.abort()
    assert relay.aborted and main.aborted and slots.freed == [10] and rooms.released == [R2]
    relay.status = Poll.Failed
    assert s.poll() == Poll.Failed
    with pytest.raises(FakeTransferError):
        s.failure_exception()
    s.clear()
    assert slots.freed == [10] and rooms.released == [R2]  # no double free


@pytest.mark.parametrize("main_prefix", [-1, 7, 1000])  # shorter than the relay's, unaligned, past the prompt
def test_a_main_prefix_that_does_not_extend_the_relays_on_a_page_fails_only_the_main(main_prefix):
    s, relay, main, slots, rooms, _ = make(page_size=4, main_prefix=main_prefix)
    main.bootstrap()
    bootstrap_relay(s, relay, 3)
    s.send(pages(0, 3))
    relay.status = Poll.Success
    assert s.poll() == Poll.Success
    assert main.sent == [] and rooms.failed and slots.copies == []
    assert relay.pages() == [0, 1, 2]


def test_no_free_metadata_slot_fails_only_the_main():
    s, relay, main, slots, rooms, _ = make()
    slots.free_slots.clear()
    main.bootstrap()
    bootstrap_relay(s, relay, 2)
    s.send(pages(0, 2))
    relay.status = Poll.Success
    assert s.poll() == Poll.Success and main.sent == [] and "metadata slot" in rooms.failed[0][1]


def test_early_send_event_reaches_the_relay_and_the_mains_copy_of_the_chunk():
    s, relay, main, *_ = make()
    bootstrap_relay(s, relay, 4)
    event = object()
    s._early_send_wait_event = event
    s.send(pages(0, 2))
    s.send(pages(2, 4))
    assert relay.waits_seen == [event, None]
    main.bootstrap()
    s.poll()
    assert main.waits_seen == [event, None]


def test_other_attributes_are_the_relays():
    s, relay, *_ = make()
    relay.kv_mgr = "manager"
    assert s.kv_mgr == "manager" and s.bootstrap_room == R and s.main_state is MainState.WAITING


def test_poll_mirror_equals_sglangs_kvpoll():
    base = pytest.importorskip("sglang.srt.disaggregation.base")
    assert {p.name: int(p) for p in Poll} == {p.name: getattr(base.KVPoll, p.name) for p in Poll}


def test_host_index_events_travel_with_their_chunk_to_both_legs():
    s, relay, main, *_ = make(main_prefix=1)
    bootstrap_relay(s, relay, 4)
    ev1, ev2 = object(), object()
    s.send(pages(0, 2), indices_event=ev1)
    s.send(pages(2, 4), indices_event=ev2)
    main.bootstrap()
    s.poll()
    assert [x.extra for x in relay.sent] == [{"indices_event": ev1}, {"indices_event": ev2}]
    assert [x.extra for x in main.sent] == [{"indices_event": ev1}, {"indices_event": ev2}]
    assert main.pages() == [1, 2, 3]

