"""Packed WAN path, MD's side: offering landing regions, unpacking on the room's first Success, quarantining
regions of failed or released rooms, and a corrupt block table failing its one request cleanly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_pdd.protocol.landing import ENTRY, BlockEntry, align_up, decode_offer
from sglang_pdd.transfer.kv_pool_view import ATTR, view_of
from sglang_pdd.transfer.packed_receiver import FAILED, SUCCESS, PackedReceiver, region_size

from tests.fakes.clock import FakeClock
from tests.fakes.kv_manager import FakeKVManager
from tests.unit.transfer.packed_wan_link import assert_landed, assert_untouched, make_link, wan_pool

DST = [9, 3, 5, 1]
SRC = [2, 7, 4, 11]
WAITING, TRANSFERRING = 2, 3  # sglang's KVPoll.WaitingForInput / Transferring


def clocked(link) -> FakeClock:
    clock = FakeClock(50.0)
    link.rx.arena._clock = clock
    return clock


def sent(mode: str = "plain", **kw):
    """A link whose room 7 was offered and fully sent by P (one block)."""
    link = make_link(mode, **kw)
    link.open_room(7, DST)
    assert link.tx.send(link.p, "s", np.asarray(SRC), np.asarray(DST)) == 0
    return link


# -- offers ---------------------------------------------------------------------------------------------------


def test_mode_off_offers_nothing_and_polls_pass_through():
    link = make_link("off")
    assert link.rx.arena is None
    assert link.rx.offer(link.md, 7, np.asarray(DST)) is None
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)
    assert link.rx.on_poll(link.md, 7, FAILED) == (FAILED, None)
    link.rx.release(7)
    assert link.rx_events == [] and link.rx.buffer is None and link.md.engine.calls == []


@pytest.mark.parametrize("mode", ["plain", "fp8"])
def test_an_offer_describes_a_region_of_mds_pool(mode):
    link = make_link(mode)
    frame = link.rx.offer(link.md, 7, np.asarray(DST))
    offer = decode_offer(frame)
    view = view_of(link.md)
    entries, data_off, size = region_size(view, 4, mode == "fp8")
    assert (offer.table_entries, offer.data_off, offer.size) == (entries, data_off, size) == (4, 128, size)
    assert offer.num_pages == 4 and offer.fp8 == (mode == "fp8") and offer.geometry() == view.geometry()
    base = link.rx.buffer.data_ptr()
    assert base <= offer.ptr and offer.ptr + offer.size <= base + link.rx.buffer.numel()
    assert offer.data_size >= view.layout(4, mode == "fp8").nbytes + 4 * 64
    assert link.rx.arena.used() == align_up(size) and link.rx.rooms() == 1
    assert link.rx_events == ["offered"]
    assert link.md.engine.calls == [("register", base, link.rx.buffer.numel())]


def test_an_offer_starts_with_an_empty_table_even_in_reused_memory():
    link = make_link()
    first = decode_offer(link.rx.offer(link.md, 1, np.asarray(DST)))
    assert link.rx.on_poll(link.md, 1, SUCCESS) == (SUCCESS, None)  # unused: freed
    link.rx.buffer.fill_(0xFF)  # what a previous room left behind
    second = decode_offer(link.rx.offer(link.md, 2, np.asarray(DST)))
    assert second.ptr == first.ptr and link.table(2) == []


def test_the_same_room_offered_twice_gets_the_same_region():
    link = make_link()
    first = link.rx.offer(link.md, 7, np.asarray(DST))
    used = link.rx.arena.used()
    assert link.rx.offer(link.md, 7, np.asarray(DST)) == first  # a message per prefill rank
    assert link.rx.arena.used() == used and link.rx.rooms() == 1 and link.rx_events == ["offered"]


def test_the_landing_buffer_is_made_once_and_registered_once_per_engine():
    link = make_link()
    link.rx.offer(link.md, 1, np.asarray(DST))
    buf = link.rx.buffer
    link.rx.offer(link.md, 2, np.asarray([0, 2]))
    other = FakeKVManager(wan_pool(fill=0.0))
    link.rx.offer(other, 3, np.asarray([4]))
    assert link.rx.buffer is buf and len(link.md.engine.calls) == 1 and len(other.engine.calls) == 1


def test_a_full_arena_offers_nothing_until_a_region_is_freed():
    probe = make_link()
    size = region_size(view_of(probe.md), len(DST), False)[2]
    link = make_link(arena_bytes=align_up(size) + 64)
    assert link.rx.offer(link.md, 1, np.asarray(DST)) is not None
    assert link.rx.offer(link.md, 2, np.asarray(DST)) is None
    assert link.rx_events == ["offered", "not offered: arena full"]
    assert link.rx.rooms() == 1
    link.rx.on_poll(link.md, 1, SUCCESS)  # nothing written: an unused region, freed
    assert link.rx.offer(link.md, 2, np.asarray(DST)) is not None


def test_an_arena_too_small_for_any_room_offers_nothing():
    link = make_link(arena_bytes=64)
    assert link.rx.offer(link.md, 1, np.asarray(DST)) is None
    assert link.rx_events == ["not offered: arena full"]


def test_no_offer_without_a_pool_view_or_pages():
    link = make_link()
    assert link.rx.offer(link.md, 1, np.asarray([], dtype=np.int64)) is None
    setattr(link.md, ATTR, "pool MLATokenToKVPool")
    assert link.rx.offer(link.md, 1, np.asarray(DST)) is None
    assert link.rx_events == ["not offered: pool MLATokenToKVPool"] and link.rx.arena.used() == 0


# -- polls ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "fp8"])
def test_success_unpacks_and_frees_the_region(mode):
    link = sent(mode)
    before = link.md.pool.snapshot()
    for status in (WAITING, TRANSFERRING):
        assert link.rx.on_poll(link.md, 7, status) == (status, None)
    assert link.rx.rooms() == 1 and torch.equal(link.md.pool.k_buffer[0], before[0])
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC, DST, fp8=mode == "fp8")
    assert_untouched(link, before, DST)
    assert link.rx.arena.used() == 0 and link.rx_events == ["offered", "unpacked"]


def test_a_room_without_a_region_passes_through():
    link = make_link()
    assert link.rx.on_poll(link.md, 99, SUCCESS) == (SUCCESS, None)
    assert link.rx.on_poll(link.md, 99, FAILED) == (FAILED, None)
    assert link.rx_events == []


def test_success_with_an_empty_table_frees_an_unused_region():
    link = make_link()
    link.open_room(7, DST)  # P sent everything page by page
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)
    assert link.rx_events == ["offered", "unused"] and link.rx.arena.used() == 0


def test_a_failed_room_quarantines_its_region_for_the_grace_period():
    link = sent()
    clock = clocked(link)
    before = link.md.pool.snapshot()
    assert link.rx.on_poll(link.md, 7, FAILED) == (FAILED, None)
    assert link.rx_events[-1] == "failed" and link.rx.rooms() == 0
    assert link.rx.arena.quarantined() == 1 and link.rx.arena.used() > 0
    assert all(torch.equal(a, b) for a, b in zip(before, link.md.pool.buffers()))  # nothing unpacked
    clock.t += link.rx.arena.grace_s - 1
    assert link.rx.arena.used() > 0
    clock.t += 1
    assert link.rx.arena.used() == 0 and link.rx.arena.quarantined() == 0
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)  # region gone: nothing to do


def test_release_quarantines_and_is_idempotent():
    link = sent()
    clock = clocked(link)
    link.rx.release(7)
    link.rx.release(7)
    assert link.rx_events == ["offered", "released"]
    assert link.rx.arena.quarantined() == 1 and link.rx.rooms() == 0
    clock.t += link.rx.arena.grace_s
    assert link.rx.arena.used() == 0


def test_a_released_room_polling_success_later_does_not_unpack():
    link = sent()
    link.rx.release(7)
    before = link.md.pool.snapshot()
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)
    assert all(torch.equal(a, b) for a, b in zip(before, link.md.pool.buffers()))


def test_skip_unpack_leaves_mds_pool_untouched():
    link = make_link(skip_unpack=lambda: True)
    link.open_room(7, DST)
    assert link.tx.send(link.p, "s", np.asarray(SRC), np.asarray(DST)) == 0
    before = link.md.pool.snapshot()
    assert link.rx.on_poll(link.md, 7, SUCCESS) == (SUCCESS, None)
    assert all(torch.equal(a, b) for a, b in zip(before, link.md.pool.buffers()))
    assert link.rx.arena.used() == 0 and link.rx_events == ["offered", "unused"]
    with pytest.raises(AssertionError):  # the negative control shows: MD still holds its sentinel
        assert_landed(link, SRC, DST, fp8=False)


# -- corrupt tables --------------------------------------------------------------------------------------------


def _n(link, pages: int) -> int:
    return view_of(link.md).layout(pages, False).nbytes


CORRUPT = {
    "bad-tag": (lambda link, o: ENTRY.pack(0, 1, 0, o.tag ^ 1), "bad tag"),
    "past-last-page": (lambda link, o: BlockEntry(3, 2, 0).encode(o.tag), "outside the room's 4 pages"),
    "negative-page": (lambda link, o: BlockEntry(-1, 1, 0).encode(o.tag), "outside"),
    "no-pages": (lambda link, o: BlockEntry(0, 0, 64).encode(o.tag), "outside"),
    "overlapping-pages": (lambda link, o: BlockEntry(0, 2, 0).encode(o.tag)
                          + BlockEntry(1, 1, align_up(_n(link, 2))).encode(o.tag), "overlaps an earlier block"),
    "overlapping-bytes": (lambda link, o: BlockEntry(0, 1, 0).encode(o.tag) + BlockEntry(1, 1, 0).encode(o.tag),
                          "overlaps the previous block"),
    "past-data-area": (lambda link, o: BlockEntry(0, 1, align_up(o.data_size)).encode(o.tag), "past the data area"),
    "huge-block": (lambda link, o: BlockEntry(0, 4, 64 * 40).encode(o.tag), "past the data area"),
    "misaligned": (lambda link, o: BlockEntry(0, 1, 32).encode(o.tag), "misaligned"),
    "negative-offset": (lambda link, o: BlockEntry(0, 1, -64).encode(o.tag), "overlaps the previous block"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_table_fails_the_request_and_quarantines_the_region(case):
    make, match = CORRUPT[case]
    link = make_link()
    link.open_room(7, DST)
    _, offer = link.region(7)
    link.write_table(7, make(link, offer))
    status, reason = link.rx.on_poll(link.md, 7, SUCCESS)
    assert status == FAILED and "could not be unpacked" in reason and match in reason
    assert link.rx_events == ["offered", "corrupt"] and link.rx.rooms() == 0
    assert link.rx.arena.quarantined() == 1 and link.rx.arena.used() > 0


def test_a_corrupt_entry_after_good_blocks_still_fails_the_request():
    link = make_link(staging_bytes=1)
    link.open_room(7, DST)
    assert link.tx.send(link.p, "s", np.asarray(SRC[:2]), np.asarray(DST[:2])) == 0
    off, offer = link.region(7)
    link.rx.buffer[off + 2 * ENTRY.size: off + 3 * ENTRY.size] = torch.frombuffer(
        bytearray(BlockEntry(0, 1, 4096).encode(offer.tag)), dtype=torch.uint8)  # page 0 again
    status, reason = link.rx.on_poll(link.md, 7, SUCCESS)
    assert status == FAILED and "overlaps an earlier block" in reason


def test_a_pool_view_gone_at_unpack_time_fails_the_request():
    link = sent()
    setattr(link.md, ATTR, "warm-up error: boom")
    status, reason = link.rx.on_poll(link.md, 7, SUCCESS)
    assert status == FAILED and "pool view is gone" in reason
    assert link.rx.arena.quarantined() == 1


def test_the_receiver_keeps_serving_after_a_corrupt_room():
    link = make_link()
    link.open_room(1, DST)
    link.write_table(1, ENTRY.pack(0, 1, 0, 1))
    assert link.rx.on_poll(link.md, 1, SUCCESS)[0] == FAILED
    link.open_room(2, [0, 2])
    assert link.tx.send(link.p, "s", np.asarray([5, 6]), np.asarray([0, 2])) == 0
    assert link.rx.on_poll(link.md, 2, SUCCESS) == (SUCCESS, None)
    assert_landed(link, [5, 6], [0, 2], fp8=False)


def test_mode_is_read_per_receiver():
    assert PackedReceiver("fp8", 1 << 16).arena.nbytes == 1 << 16


def test_a_write_delayed_past_the_quarantine_is_rejected_by_the_regions_next_owner():
    link = make_link()
    clock = clocked(link)
    link.open_room(7, DST)  # P has room 7's offer; its write is delayed
    off7, _ = link.region(7)
    link.rx.release(7)  # MD gave room 7 up: its region is quarantined...
    clock.t += link.rx.arena.grace_s + 1  # ...and released; room 8 is offered the same region
    other = [0, 2, 4, 6]
    link.rx.offer(link.md, 8, np.asarray(other))
    assert link.region(8)[0] == off7
    before = link.md.pool.snapshot()
    assert link.tx.send(link.p, "s", np.asarray(SRC), np.asarray(DST)) == 0  # room 7's late write lands
    status, reason = link.rx.on_poll(link.md, 8, SUCCESS)
    assert status == FAILED and "bad tag" in reason and "another owner" in reason
    assert_untouched(link, before, [])  # room 7's KV went nowhere in MD's pool
