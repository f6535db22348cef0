"""Wire format of the packed WAN path: MD's landing offer, and the block table P writes into it.

MainDecode (the receiver across the WAN) reserves a landing region in one registered host buffer for
a room's missed pages and appends a `LandingOffer` frame to the metadata message that tells P where
its pages are (sglang's `TransferInfo`, decoded by position on P, ignores frames past its own). P packs
each chunk's pages (all layers, K and V) into one block, writes it into the region's data area, and
writes one `BlockEntry` into the region's block table, in the same batch write. MD scatters the blocks
into its pages when the room's transfer succeeded.

    region  [table: entries x 32 bytes][data: blocks, each at a 64-byte aligned offset]
    entry   <pos_page, n_pages, byte_off, tag>  int64 each; a zero entry ends the table

The tag is the offer's: `block_tag(room, generation)`, drawn by MD per offer (the generation counts
MD's offers), so an entry a late write puts into a region that has been released and offered to
another room since carries a tag its new owner does not expect, and is rejected.

A block is `kernels.PackLayout(num_tokens = n_pages * page_size)` of the pool's geometry (an MLA pool's:
one latent buffer per layer as K, `v_heads = v_head_dim = 0`). Pages not
named by any entry were written page by page (P may fall back per chunk): MD leaves them alone.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

import msgspec

LANDING_VERSION = 2
FRAME_MAGIC = b"PDD-LANDING\x00"
ENTRY = struct.Struct("<qqqq")
TAG_MASK = (1 << 63) - 1
BLOCK_ALIGN = 64
MODES = ("off", "plain", "fp8")


class LandingError(ValueError):
    """A landing frame or block table that cannot be used; the reason says why."""


class LandingOffer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ptr: int  # address of the region in MD's registered landing buffer
    size: int  # bytes of the region
    table_entries: int  # capacity of the block table (at the region's start)
    data_off: int  # byte offset of the data area in the region
    page_size: int
    num_pages: int  # pages of the room's transfer, in the order of its destination pages
    layers: int
    k_heads: int
    k_head_dim: int
    v_heads: int
    v_head_dim: int
    dtype: str  # "float16" | "bfloat16" | "float32"
    tag: int = 0  # every block entry's tag (block_tag of the room and the offer's generation)
    fp8: bool = False
    v: int = LANDING_VERSION

    @property
    def data_size(self) -> int:
        return self.size - self.data_off

    def geometry(self) -> tuple:
        return (self.page_size, self.layers, self.k_heads, self.k_head_dim, self.v_heads, self.v_head_dim,
                self.dtype)


def block_tag(room: int, generation: int) -> int:
    """The tag of a region's block entries for one offer: never zero (a zero entry ends a table)."""
    digest = hashlib.blake2b(struct.pack("<QQ", room & (2**64 - 1), generation & (2**64 - 1)), digest_size=8,
                             person=b"pdd-landing").digest()
    return (int.from_bytes(digest, "little") & TAG_MASK) or 1


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LandingOffer)


def encode_offer(offer: LandingOffer) -> bytes:
    return FRAME_MAGIC + _ENCODER.encode(offer)


def decode_offer(frame: bytes) -> LandingOffer | None:
    """The offer in `frame`; None when the frame is not a landing frame; LandingError when it is one
    that cannot be used (unknown version, malformed, inconsistent sizes)."""
    if not frame.startswith(FRAME_MAGIC):
        return None
    try:
        offer = _DECODER.decode(frame[len(FRAME_MAGIC):])
    except msgspec.DecodeError as e:
        raise LandingError(f"malformed landing offer: {e}") from None
    if offer.v != LANDING_VERSION:
        raise LandingError(f"landing offer version {offer.v}, this side speaks {LANDING_VERSION}")
    ints = (offer.ptr, offer.size, offer.table_entries, offer.data_off, offer.page_size, offer.num_pages,
            offer.layers, offer.k_heads, offer.k_head_dim, offer.v_heads, offer.v_head_dim)
    if min(ints) < 0 or min(ints[4:9]) < 1 or offer.table_entries < 1:
        raise LandingError(f"landing offer with a non-positive size: {offer}")
    if (offer.v_heads == 0) != (offer.v_head_dim == 0):  # both 0: an MLA pool's latent rows, no V
        raise LandingError(f"landing offer with V heads but no V head dim, or the reverse: {offer}")
    if offer.data_off < offer.table_entries * ENTRY.size or offer.data_off % BLOCK_ALIGN or offer.data_off > offer.size:
        raise LandingError(f"landing offer's data area overlaps its table or the region: {offer}")
    if not 0 < offer.tag <= TAG_MASK:
        raise LandingError(f"landing offer without a block tag: {offer}")
    if offer.dtype not in ("float16", "bfloat16", "float32"):
        raise LandingError(f"landing offer dtype {offer.dtype!r}")
    return offer


class BlockEntry(NamedTuple):
    pos_page: int  # first page of the block, as a position in the room's destination pages
    n_pages: int
    byte_off: int  # offset of the block in the data area

    def encode(self, tag: int) -> bytes:
        return ENTRY.pack(self.pos_page, self.n_pages, self.byte_off, tag)


def decode_table(raw: bytes, tag: int) -> list[BlockEntry]:
    """The entries of a block table, up to the first zero entry; LandingError on a corrupt entry or
    one whose tag is not `tag` (written for another owner of the region, or half written)."""
    out, expected = [], tag
    for i in range(len(raw) // ENTRY.size):
        pos, n, off, tag = ENTRY.unpack_from(raw, i * ENTRY.size)
        if pos == n == off == tag == 0:
            break
        if tag != expected:
            raise LandingError(f"block table entry {i}: bad tag {tag:#x} (a write for another owner of the "
                               "region, or a half-written entry)")
        out.append(BlockEntry(pos, n, off))
    return out


def align_up(n: int) -> int:
    return (n + BLOCK_ALIGN - 1) // BLOCK_ALIGN * BLOCK_ALIGN
