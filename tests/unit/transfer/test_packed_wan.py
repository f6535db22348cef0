"""Packed WAN path, P -> MD in one process: MD's pool view, P packing each chunk into MD's landing region
(`PackedSender`), MD unpacking it on success (`PackedReceiver`), and every case where P goes page by page.

The real pack -> "wire" -> unpack path runs: the fake manager's `_transfer_data` copies the bytes between
registered host buffers (see packed_wan_link.py and tests/fakes/kv_manager.py). MD's pool starts filled with
a sentinel, so rows written that should not be show up.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_pdd.kernels.kv_pack_layout import PackLayout
from sglang_pdd.protocol.landing import BlockEntry, align_up
from sglang_pdd.transfer.kv_pool_view import ATTR, KVPoolView, attach, view_of, warm_up
from sglang_pdd.transfer.packed_receiver import SUCCESS
from sglang_pdd.transfer.packed_sender import _CURSOR_ATTR

from tests.fakes.kv_manager import FakeKVManager
from tests.fakes.kv_pool import MHATokenToKVPool
from tests.unit.transfer.packed_wan_link import assert_landed, assert_untouched, make_link, wan_pool

DST = [9, 3, 5, 1, 12, 0, 14]  # MD's pages of the room, in token order
SRC = [2, 7, 4, 11, 0, 15, 6]  # P's pages of the same tokens
CHUNKS = [slice(0, 3), slice(3, 4), slice(4, 7)]


def send(link, chunk: slice, session: str = "s"):
    return link.tx.send(link.p, session, np.asarray(SRC[chunk]), np.asarray(DST[chunk]))


# -- pool view ------------------------------------------------------------------------------------------------


def test_pool_view_of_sglangs_pool_and_its_geometry():
    pool = wan_pool(page_size=4)
    manager = FakeKVManager(pool)
    view = view_of(manager)
    assert isinstance(view, KVPoolView) and view == KVPoolView.of(pool, 4, manager)
    assert view.geometry() == (4, 2, 2, 8, 2, 4, "float32")
    assert view.device == torch.device("cpu") and view.dtype_name == "float32"
    assert view.layout(3, True) == PackLayout(2, 12, 2, 8, 2, 4, torch.float32, True)
    assert view.slots(np.array([3, 1])).tolist() == [12, 13, 14, 15, 4, 5, 6, 7]
    assert KVPoolView.of(pool, 1).slots([5, 2]).tolist() == [5, 2]
    assert KVPoolView.of(wan_pool(dtype=torch.bfloat16), 4).dtype_name == "bfloat16"


class MHATokenToKVPoolFP4(MHATokenToKVPool):
    pass


def _pool(**attrs):
    pool = wan_pool()
    for k, v in attrs.items():
        setattr(pool, k, v)
    return pool


@pytest.mark.parametrize("pool, reason", [
    (wan_pool(MHATokenToKVPoolFP4), "pool MHATokenToKVPoolFP4"),
    (SimpleNamespace(dtype=torch.float16), "pool SimpleNamespace"),
    (_pool(use_hnd=True), "pool layout"),
    (_pool(store_dtype=torch.uint8), "pool layout"),
    (_pool(k_buffer=torch.zeros(2, 8, 2, 8)), "pool buffers"),
    (_pool(k_buffer=[], v_buffer=[]), "pool buffers"),
    (_pool(v_buffer=[torch.zeros(64, 2, 4)]), "pool buffers"),
    (_pool(k_buffer=[torch.zeros(64, 2, 8, dtype=torch.int8)] * 2), "pool dtype torch.int8"),
    (_pool(k_buffer=[torch.zeros(64, 16)] * 2), "pool buffers of 2 dims"),
], ids=["subclass", "other-class", "hnd", "store-dtype", "tensor", "empty", "layers", "int8", "2d"])
def test_pool_view_refuses_pools_it_cannot_pack(pool, reason):
    assert KVPoolView.of(pool, 4).startswith(reason)


@pytest.mark.parametrize("change, reason", [
    (dict(attn_tp_size=2), "attention TP/PP"),
    (dict(pp_size=2), "attention TP/PP"),
    (dict(kv_args=SimpleNamespace(kv_data_ptrs=[1, 2, 3, 4])), "kv_args differ"),
    (dict(kv_args=None), "kv_args differ"),
], ids=["attn-tp", "pp", "draft-ptrs", "no-kv-args"])
def test_pool_view_refuses_managers_it_cannot_serve(change, reason):
    manager = FakeKVManager(wan_pool())
    for k, v in change.items():
        setattr(manager, k, v)
    attach(manager, manager.pool)
    assert reason in view_of(manager)


def test_pool_view_refuses_kv_args_with_extra_buffers():
    manager = FakeKVManager(wan_pool())
    manager.kv_args.kv_data_ptrs = manager.kv_args.kv_data_ptrs + [torch.zeros(4).data_ptr()]
    assert KVPoolView.of(manager.pool, 4, manager).startswith("kv_args differ")


def test_attach_reads_the_page_size_and_view_of_explains_a_missing_view():
    pool = wan_pool(page_size=1)
    pool.page_size = None  # sglang pools without paging
    manager = FakeKVManager(pool)
    assert view_of(manager).page_size == 1
    assert "no pool view" in view_of(SimpleNamespace())
    warm_up(manager, fp8=True)  # CPU: nothing to compile, the view stays
    assert isinstance(getattr(manager, ATTR), KVPoolView)


# -- round trips ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("mode", ["plain", "fp8"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_chunks_packed_on_p_land_in_mds_pages(page_size, mode, dtype):
    link = make_link(mode, page_size, dtype=dtype)
    before = link.md.pool.snapshot()
    link.open_room(77, DST)
    assert [send(link, c) for c in CHUNKS] == [0, 0, 0]
    assert link.tx_events == ["packed"] * 3 and link.rx_events == ["offered"]
    table = link.table(77)
    assert [(e.pos_page, e.n_pages) for e in table] == [(0, 3), (3, 1), (4, 3)]
    assert table[0].byte_off == 0 and all(e.byte_off % 64 == 0 for e in table)
    assert all(a.byte_off < b.byte_off for a, b in zip(table, table[1:]))
    assert link.rx.arena.used() > 0
    assert link.rx.on_poll(link.md, 77, SUCCESS) == (SUCCESS, None)
    assert link.rx_events == ["offered", "unpacked"]
    assert_landed(link, SRC, DST, fp8=mode == "fp8")
    assert_untouched(link, before, DST)
    assert link.rx.arena.used() == 0 and link.rx.rooms() == 0
    assert len(link.p.batches) == 3 and all(len(b) == 2 for b in link.p.batches)  # block + table entry


def test_a_second_success_poll_does_not_unpack_again():
    link = make_link()
    link.open_room(77, DST)
    assert send(link, slice(0, 7)) == 0
    assert link.rx.on_poll(link.md, 77, SUCCESS) == (SUCCESS, None)
    link.md.pool.k_buffer[0].fill_(1.0)
    assert link.rx.on_poll(link.md, 77, SUCCESS) == (SUCCESS, None)
    assert bool((link.md.pool.k_buffer[0] == 1.0).all()) and link.rx_events == ["offered", "unpacked"]


def test_concurrent_rooms_land_in_their_own_regions():
    link = make_link("fp8")
    link.open_room(1, DST[:4])
    link.open_room(2, DST[4:])
    assert link.tx.send(link.p, "s", np.asarray(SRC[4:]), np.asarray(DST[4:])) == 0
    assert link.tx.send(link.p, "s", np.asarray(SRC[:4]), np.asarray(DST[:4])) == 0
    assert link.rx.on_poll(link.md, 2, SUCCESS) == (SUCCESS, None)
    assert link.rx.on_poll(link.md, 1, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC, DST, fp8=True)
    assert link.rx.arena.used() == 0


# -- sub-blocks ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "fp8"])
@pytest.mark.parametrize("pages_per_block, blocks", [(2, [(0, 2), (2, 2), (4, 2), (6, 1)]),
                                                     (3, [(0, 3), (3, 3), (6, 1)])])
def test_a_chunk_larger_than_the_staging_limit_goes_in_several_blocks(mode, pages_per_block, blocks):
    probe = make_link(mode)
    one_page = view_of(probe.p).layout(1, mode == "fp8").nbytes
    link = make_link(mode, staging_bytes=pages_per_block * one_page + one_page // 2)
    before = link.md.pool.snapshot()
    link.open_room(5, DST)
    assert send(link, slice(0, 7)) == 0
    table = link.table(5)
    assert [(e.pos_page, e.n_pages) for e in table] == blocks
    layout = view_of(link.p).layout
    for a, b in zip(table, table[1:]):
        assert b.byte_off == align_up(a.byte_off + layout(a.n_pages, mode == "fp8").nbytes)
    assert link.tx_events == ["packed"] and len(link.p.batches) == len(blocks)
    assert link.rx.on_poll(link.md, 5, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC, DST, fp8=mode == "fp8")
    assert_untouched(link, before, DST)
    assert link.rx.arena.used() == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_one_page_per_block_still_fits_the_region(page_size):
    """The worst case for the region's slack: every page its own block, each aligned and padded."""
    link = make_link("fp8", page_size, staging_bytes=1, pool=dict(head_dim=6, v_head_dim=3))
    link.open_room(5, DST)
    assert [send(link, c) for c in CHUNKS] == [0, 0, 0]
    assert [(e.pos_page, e.n_pages) for e in link.table(5)] == [(i, 1) for i in range(7)]
    assert link.rx.on_poll(link.md, 5, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC, DST, fp8=True)


# -- mixed: some chunks page by page ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "fp8"])
def test_md_unpacks_only_the_packed_blocks_and_leaves_page_by_page_pages(mode):
    link = make_link(mode)
    link.open_room(3, DST)
    link.page_by_page(SRC[0:3], DST[0:3])  # chunk 0 went page by page
    marker = DST[3]
    link.md.pool.k_buffer[0][link.md.pool.slots([marker])] = 42.0  # chunk 1 too, with a marker
    assert send(link, CHUNKS[2]) == 0
    before = link.md.pool.snapshot()
    assert [(e.pos_page, e.n_pages) for e in link.table(3)] == [(4, 3)]
    assert link.rx.on_poll(link.md, 3, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC[4:], DST[4:], fp8=mode == "fp8")
    assert_untouched(link, before, DST[4:])
    assert_landed(link, SRC[:3], DST[:3], fp8=False)  # exact even with fp8: never unpacked
    assert bool((link.md.pool.k_buffer[0][link.md.pool.slots([marker])] == 42.0).all())


# -- P falls back to page by page ---------------------------------------------------------------------------------


def test_disabled_sender_leaves_everything_page_by_page():
    link = make_link("plain")
    link.tx.enabled = False
    link.open_room(1, DST)
    assert send(link, CHUNKS[0]) is None
    assert link.p.batches == [] and link.tx_events == []


@pytest.mark.parametrize("case", ["no-room", "no-offer", "other-session", "empty", "len-mismatch", "not-a-slice",
                                  "unknown-first-page"])
def test_chunks_without_a_matching_offer_go_page_by_page(case):
    link = make_link("plain")
    if case != "no-room":
        link.open_room(1, DST, offer=case != "no-offer")
    src, dst, session = np.asarray(SRC[:3]), np.asarray(DST[:3]), "s"
    if case == "other-session":
        session = "t"
    elif case == "empty":
        src, dst = src[:0], dst[:0]
    elif case == "len-mismatch":
        src = src[:2]
    elif case == "not-a-slice":
        dst = np.asarray([DST[0], DST[2], DST[1]])
    elif case == "unknown-first-page":
        dst = np.asarray([15, DST[1], DST[2]])
    assert link.tx.send(link.p, session, src, dst) is None
    assert link.p.batches == [] and "packed" not in link.tx_events


def test_a_dummy_or_offerless_info_next_to_the_room_is_not_ambiguous():
    link = make_link("plain")
    link.open_room(1, DST)
    link.open_room(2, DST, offer=False)  # e.g. another MD that did not offer
    assert send(link, CHUNKS[0]) == 0 and link.tx_events == ["packed"]


def test_geometry_mismatch_goes_page_by_page():
    link = make_link("plain", p_pool=dict(head_dim=16))  # P's K head dim 16, MD's 8
    link.open_room(1, DST)
    assert send(link, CHUNKS[0]) is None
    assert link.tx_events == ["page by page: geometry"] and link.p.batches == []


def test_p_without_a_pool_view_goes_page_by_page():
    link = make_link("plain")
    setattr(link.p, ATTR, "attention TP/PP")
    link.open_room(1, DST)
    assert send(link, CHUNKS[0]) is None
    assert link.tx_events == ["page by page: pool: attention TP/PP"]


def test_a_full_region_sends_the_chunk_page_by_page_and_keeps_the_cursor():
    link = make_link("plain")
    info = link.open_room(1, DST)
    assert send(link, slice(0, 7)) == 0
    cursor = getattr(info, _CURSOR_ATTR)
    assert send(link, CHUNKS[2]) is None  # a resend: the data area is used up
    assert link.tx_events == ["packed", "page by page: region full"]
    assert getattr(info, _CURSOR_ATTR) == cursor and len(link.p.batches) == 1


def test_a_full_block_table_sends_the_chunk_page_by_page():
    link = make_link("plain", staging_bytes=1)  # a block per page: 7 entries, the table's capacity
    info = link.open_room(1, DST)
    assert send(link, slice(0, 7)) == 0
    assert getattr(info, _CURSOR_ATTR)[0] == 7
    assert send(link, CHUNKS[1]) is None and link.tx_events[-1] == "page by page: region full"
    assert link.rx.on_poll(link.md, 1, SUCCESS) == (SUCCESS, None)
    assert_landed(link, SRC, DST, fp8=False)


def test_pages_claimed_by_two_live_rooms_are_ambiguous():
    link = make_link("plain", arena_bytes=4 << 20)
    link.open_room(1, DST)
    link.open_room(2, DST[:3] + [10])  # MD's pages of live rooms are disjoint: anything else is suspect
    assert send(link, CHUNKS[0]) is None
    assert link.tx_events == ["page by page: ambiguous pages"] and link.p.batches == []
    assert send(link, CHUNKS[2]) == 0  # pages only room 1 names still pack


def test_transfer_infos_changing_while_p_looks_is_retried():
    link = make_link("plain")
    link.open_room(1, DST)
    real = link.p.transfer_infos

    class Flaky(dict):
        calls = 0

        def items(self):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("dictionary changed size during iteration")
            return real.items()

    link.p.transfer_infos = Flaky(real)
    assert send(link, CHUNKS[0]) == 0 and Flaky.calls == 2


# -- transfer failure -----------------------------------------------------------------------------------------------


def test_a_failed_write_returns_its_status_and_does_not_advance_the_cursor():
    link = make_link("plain")
    info = link.open_room(1, DST)
    link.p.fail_from = 0
    assert send(link, CHUNKS[0]) == -1
    assert not hasattr(info, _CURSOR_ATTR) and "packed" not in link.tx_events
    link.p.fail_from = None
    assert send(link, CHUNKS[0]) == 0  # a retry starts at the region's start
    assert link.table(1) == [BlockEntry(0, 3, 0)]


def test_a_write_failing_mid_chunk_keeps_the_blocks_already_written():
    link = make_link("plain", staging_bytes=1)
    info = link.open_room(1, DST)
    link.p.fail_from = 2
    assert send(link, CHUNKS[0]) == -1
    assert getattr(info, _CURSOR_ATTR)[0] == 2 and len(link.p.batches) == 3
    assert [e.pos_page for e in link.table(1)] == [0, 1]


def test_the_staging_buffer_is_registered_once_per_manager():
    link = make_link("plain")
    link.open_room(1, DST)
    for c in CHUNKS:
        assert send(link, c) == 0
    assert [c[0] for c in link.p.engine.calls] == ["register"]
    assert link.md.engine.calls[0][0] == "register" and len(link.md.engine.calls) == 1


def test_a_pack_error_sends_the_chunk_page_by_page_and_never_raises(monkeypatch):
    from sglang_pdd.transfer import packed_sender

    def broken(*a, **kw):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(packed_sender, "pack_kv", broken)
    link = make_link("plain")
    info = link.open_room(1, DST)
    assert send(link, CHUNKS[0]) is None  # the caller writes it page by page
    assert "page by page: pack error" in link.tx_events and not hasattr(info, _CURSOR_ATTR)
    assert link.p.batches == []
