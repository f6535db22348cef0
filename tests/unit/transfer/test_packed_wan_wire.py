"""Packed WAN path, wire and bookkeeping: the landing offer frame, the block table, P reading an offer off
sglang's TransferInfo message (`read_offer`), and MD's landing arena (first-fit, coalescing, quarantine)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from sglang_pdd.protocol.landing import (
    BLOCK_ALIGN,
    ENTRY,
    TAG_MASK,
    block_tag,
    FRAME_MAGIC,
    LANDING_VERSION,
    BlockEntry,
    LandingError,
    LandingOffer,
    align_up,
    decode_offer,
    decode_table,
    encode_offer,
)
from sglang_pdd.transfer.landing_arena import LandingArena
from sglang_pdd.transfer.packed_sender import LANDING_EXTENSION, METADATA_FRAMES, OFFER_ATTR, offer_of, read_offer

from tests.fakes.clock import FakeClock


def offer(**kw) -> LandingOffer:
    base = dict(ptr=1 << 20, size=4096, table_entries=4, data_off=128, page_size=4, num_pages=4, layers=2,
                k_heads=2, k_head_dim=8, v_heads=2, v_head_dim=4, dtype="float16", tag=block_tag(7, 0))
    return LandingOffer(**{**base, **kw})


def raw_frame(fields: dict) -> bytes:
    """A landing frame with arbitrary fields (bypasses LandingOffer's own typing)."""
    return FRAME_MAGIC + msgspec.msgpack.encode(fields)


def offer_fields(**kw) -> dict:
    return {**msgspec.structs.asdict(offer()), **kw}


# -- offer frame --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [False, True])
def test_offer_round_trips_through_its_frame(fp8):
    o = offer(fp8=fp8, dtype="bfloat16")
    frame = encode_offer(o)
    assert frame.startswith(FRAME_MAGIC)
    assert decode_offer(frame) == o
    assert o.v == LANDING_VERSION
    assert o.data_size == 4096 - 128
    assert o.geometry() == (4, 2, 2, 8, 2, 4, "bfloat16")


def test_an_mla_offer_has_no_v_and_round_trips():
    o = msgspec.structs.replace(offer(), k_heads=1, k_head_dim=576, v_heads=0, v_head_dim=0)
    assert decode_offer(encode_offer(o)) == o and o.geometry()[4:6] == (0, 0)


@pytest.mark.parametrize("frame", [b"", b"PDD-LANDING", b"\x81\xa3ptr\x01", b"PDD-OTHER\x00\x80"])
def test_a_frame_without_the_magic_is_not_a_landing_frame(frame):
    assert decode_offer(frame) is None


@pytest.mark.parametrize("frame, match", [
    (FRAME_MAGIC, "malformed"),
    (FRAME_MAGIC + b"\xc1", "malformed"),
    (raw_frame({"ptr": 1}), "malformed"),  # required fields missing
    (raw_frame(offer_fields(colour=1)), "malformed"),  # unknown field
    (raw_frame(offer_fields(size="big")), "malformed"),  # wrong type
    (raw_frame(offer_fields(v=LANDING_VERSION + 1)), "version"),
    (raw_frame(offer_fields(ptr=-1)), "non-positive"),
    (raw_frame(offer_fields(table_entries=0, data_off=0)), "non-positive"),
    (raw_frame(offer_fields(page_size=0)), "non-positive"),
    (raw_frame(offer_fields(num_pages=0)), "non-positive"),
    (raw_frame(offer_fields(v_head_dim=0)), "V heads but no V head dim"),  # only MLA has no V: both 0
    (raw_frame(offer_fields(v_heads=0)), "V heads but no V head dim"),
    (raw_frame(offer_fields(data_off=64)), "overlaps its table"),  # 4 entries need 128 bytes
    (raw_frame(offer_fields(data_off=192 + 8)), "overlaps its table"),  # misaligned
    (raw_frame(offer_fields(data_off=8192)), "overlaps its table"),  # past the region
    (raw_frame(offer_fields(dtype="int8")), "dtype"),
    (raw_frame(offer_fields(tag=0)), "without a block tag"),  # version 1 offers had none
    (raw_frame(offer_fields(tag=-5)), "without a block tag"),
])
def test_an_unusable_landing_frame_raises_landing_error(frame, match):
    with pytest.raises(LandingError, match=match):
        decode_offer(frame)
    assert issubclass(LandingError, ValueError)


def test_offer_with_an_empty_data_area_is_still_valid():
    o = offer(size=128, data_off=128)
    assert decode_offer(encode_offer(o)) == o and o.data_size == 0


# -- block table ---------------------------------------------------------------------------------------


TAG = block_tag(room=7, generation=0)


def test_block_table_round_trips_and_stops_at_the_first_zero_entry():
    entries = [BlockEntry(0, 2, 0), BlockEntry(2, 1, 640), BlockEntry(5, 3, 1280)]
    raw = b"".join(e.encode(TAG) for e in entries) + bytes(ENTRY.size) + BlockEntry(9, 1, 64).encode(TAG)
    assert decode_table(raw, TAG) == entries
    assert decode_table(bytes(4 * ENTRY.size), TAG) == []
    assert decode_table(b"", TAG) == []
    assert ENTRY.size == 32
    assert ENTRY.unpack(entries[1].encode(TAG)) == (2, 1, 640, TAG)


def test_a_full_table_without_a_terminator_decodes_every_entry():
    entries = [BlockEntry(i, 1, i * 64) for i in range(4)]
    assert decode_table(b"".join(e.encode(TAG) for e in entries), TAG) == entries


def test_block_table_with_a_bad_tag_raises():
    good = BlockEntry(0, 1, 0).encode(TAG)
    bad = ENTRY.pack(1, 1, 64, TAG ^ 1)
    with pytest.raises(LandingError, match="entry 1: bad tag"):
        decode_table(good + bad, TAG)
    with pytest.raises(LandingError, match="bad tag 0x0"):  # a half-written entry: tag still zero
        decode_table(ENTRY.pack(0, 1, 0, 0), TAG)


def test_block_tags_are_bound_to_the_room_and_the_generation():
    tags = {block_tag(room, gen) for room in (0, 7, 2**63 - 1) for gen in range(50)}
    assert len(tags) == 150 and all(0 < t <= TAG_MASK for t in tags)
    assert block_tag(7, 3) == block_tag(7, 3)  # P and MD agree through the offer, not by computing it
    entry = BlockEntry(0, 1, 0).encode(block_tag(7, 0))
    with pytest.raises(LandingError, match="another owner of the region"):  # the region's next owner
        decode_table(entry, block_tag(8, 1))


def test_align_up():
    assert [align_up(n) for n in (0, 1, 63, 64, 65, 128)] == [0, 64, 64, 64, 128, 128]
    assert BLOCK_ALIGN == 64


# -- read_offer (P side) ----------------------------------------------------------------------------------


def info(num_pages: int = 4, is_dummy: bool = False) -> SimpleNamespace:
    return SimpleNamespace(room=7, dst_kv_indices=np.arange(num_pages, dtype=np.int32), is_dummy=is_dummy)


def msg(*extra) -> list:
    return [b"x"] * METADATA_FRAMES + list(extra)


def test_read_offer_attaches_a_usable_offer():
    i = info()
    read_offer(i, msg(encode_offer(offer())))
    assert getattr(i, OFFER_ATTR) == offer()


def test_read_offer_accepts_non_bytes_frames():
    i = info()
    read_offer(i, msg(bytearray(encode_offer(offer()))))
    assert getattr(i, OFFER_ATTR) == offer()


@pytest.mark.parametrize("message", [
    msg(),  # sglang's plain 10 frames: no offer
    msg(b"some other frame"),
    msg(raw_frame(offer_fields(v=LANDING_VERSION + 1))),
    msg(FRAME_MAGIC + b"\xc1\xc1"),
    msg(raw_frame(offer_fields(dtype="int8"))),
    msg(encode_offer(offer(num_pages=5))),  # the message names 4 pages
    [b"x"] * 3,  # a short message
], ids=["no-frame", "foreign", "version", "malformed", "bad-dtype", "num-pages", "short"])
def test_read_offer_ignores_what_it_cannot_use(message):
    i = info()
    read_offer(i, message)
    assert not hasattr(i, OFFER_ATTR)


def test_read_offer_ignores_dummy_infos():
    i = info(is_dummy=True)
    read_offer(i, msg(encode_offer(offer())))
    assert not hasattr(i, OFFER_ATTR)


# -- offer_of: the offer from read_offer (stock sglang) or from TransferInfo.extensions (patch 0004) --------


def test_offer_of_reads_the_landing_extension_once():
    i = info()
    i.extensions = {LANDING_EXTENSION: encode_offer(offer()), "other.thing": b"x"}
    assert offer_of(i) == offer()
    i.extensions = {}  # decoded once: later calls do not read the extensions again
    assert offer_of(i) == offer()


def test_offer_of_prefers_the_offer_read_from_the_message():
    i = info()
    read_offer(i, msg(encode_offer(offer())))
    i.extensions = {LANDING_EXTENSION: b"garbage"}
    assert offer_of(i) == offer()


@pytest.mark.parametrize("extensions", [
    None, {}, {"other.thing": encode_offer(offer())}, {LANDING_EXTENSION: b"some other frame"},
    {LANDING_EXTENSION: raw_frame(offer_fields(v=LANDING_VERSION + 1))},
    {LANDING_EXTENSION: encode_offer(offer(num_pages=5))},
], ids=["stock", "none", "foreign-name", "foreign", "version", "num-pages"])
def test_offer_of_ignores_what_it_cannot_use(extensions):
    i = info()
    if extensions is not None:
        i.extensions = extensions
    assert offer_of(i) is None


def test_offer_of_ignores_dummy_infos():
    i = info(is_dummy=True)
    i.extensions = {LANDING_EXTENSION: encode_offer(offer())}
    assert offer_of(i) is None


# -- landing arena ------------------------------------------------------------------------------------------


def test_arena_rejects_an_empty_buffer():
    with pytest.raises(ValueError):
        LandingArena(0)


def test_arena_allocates_first_fit_in_64_byte_units():
    a = LandingArena(1024)
    assert a.alloc(1) == 0
    assert a.alloc(64) == 64
    assert a.alloc(65) == 128
    assert a.used() == 64 + 64 + 128
    assert a.alloc(0) == 256  # a zero-size region still takes one unit
    assert a.alloc(1024) is None
    assert a.alloc(1024 - 320) == 320
    assert a.used() == 1024 and a.alloc(1) is None


def test_arena_reuses_the_first_hole_that_fits():
    a = LandingArena(64 * 10)
    offs = [a.alloc(64) for _ in range(10)]
    assert offs == [64 * i for i in range(10)]
    a.free(64, 64)  # hole of 1 at 1
    a.free(256, 64)
    a.free(320, 64)  # hole of 2 at 4
    assert a.alloc(128) == 256  # too big for the first hole
    assert a.alloc(64) == 64
    assert a.alloc(64) is None


def test_arena_coalesces_freed_neighbours():
    a = LandingArena(64 * 4)
    offs = [a.alloc(64) for _ in range(4)]
    for i in (1, 3, 2):  # 2 joins its free neighbours on both sides
        a.free(offs[i], 64)
    assert a._free == [(64, 192)]
    assert a.alloc(192) == 64
    a.free(64, 192)
    a.free(0, 64)
    assert a._free == [(0, 256)] and a.used() == 0
    assert a.alloc(256) == 0


def test_arena_free_rounds_up_like_alloc():
    a = LandingArena(256)
    off = a.alloc(100)
    a.free(off, 100)
    assert a.used() == 0 and a.alloc(256) == 0


@pytest.mark.parametrize("second", [(0, 64), (0, 128), (64, 64), (32, 64)],
                         ids=["same", "covering", "inside-merged", "overlapping"])
def test_arena_double_free_raises_and_keeps_its_books(second):
    a = LandingArena(256)
    a.alloc(128)
    a.alloc(128)
    a.free(0, 128)
    with pytest.raises(ValueError, match="already free"):
        a.free(*second)
    assert a.used() == 128 and a._free == [(0, 128)]


def test_arena_quarantine_holds_a_region_for_its_grace():
    clock = FakeClock(1000.0)
    a = LandingArena(256, grace_s=5.0, clock=clock)
    off = a.alloc(256)
    a.quarantine(off, 256)
    assert a.quarantined() == 1 and a.used() == 256
    assert a.alloc(64) is None
    clock.t += 4.9
    assert a.quarantined() == 1 and a.alloc(64) is None
    clock.t += 0.1
    assert a.alloc(64) == 0  # alloc expires it first
    assert a.quarantined() == 0 and a.used() == 64


def test_arena_quarantines_expire_independently():
    clock = FakeClock(1000.0)
    a = LandingArena(256, grace_s=10.0, clock=clock)
    first, second = a.alloc(128), a.alloc(128)
    a.quarantine(first, 128)
    clock.t += 6
    a.quarantine(second, 128)
    assert a.quarantined() == 2
    clock.t += 4
    assert a.quarantined() == 1 and a.used() == 128
    clock.t += 6
    assert a.quarantined() == 0 and a.used() == 0 and a._free == [(0, 256)]


def test_arena_with_zero_grace_releases_at_the_next_look():
    a = LandingArena(128, grace_s=0.0)
    a.quarantine(a.alloc(128), 128)
    assert a.used() == 0 and a.quarantined() == 0


def test_arena_expiry_drops_a_double_freed_region_and_releases_the_rest():
    clock = FakeClock(1000.0)
    a = LandingArena(64 * 3, grace_s=1.0, clock=clock)
    offs = [a.alloc(64) for _ in range(3)]
    for off in offs:
        a.quarantine(off, 64)
    a.free(offs[1], 64)  # a bug elsewhere: the middle region is freed while quarantined
    clock.t += 1.0
    assert a.quarantined() == 0  # no exception, and nothing is left for a second release
    assert a._free == [(0, 64 * 3)] and a.used() == 0
    assert a.alloc(64 * 3) == 0


def test_arena_survives_many_rounds_of_random_alloc_free():
    rng = np.random.default_rng(0)
    a = LandingArena(64 * 50)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            off = list(live)[rng.integers(len(live))]
            a.free(off, live.pop(off))
        else:
            size = int(rng.integers(1, 64 * 6))
            off = a.alloc(size)
            if off is not None:
                end = off + align_up(size)
                assert end <= a.nbytes
                assert all(end <= o or o + align_up(s) <= off for o, s in live.items())
                live[off] = size
        assert a.used() == sum(align_up(s) for s in live.values())
    for off, size in live.items():
        a.free(off, size)
    assert a._free == [(0, a.nbytes)]


def test_offer_is_frozen():
    with pytest.raises((AttributeError, TypeError, dataclasses.FrozenInstanceError)):
        offer().ptr = 5  # type: ignore[misc]
