"""The packed WAN path's P -> MD link, end to end in one process (no sglang, no Mooncake), over the shared
fakes (tests.fakes): two pools, two KV managers whose `_transfer_data` moves bytes between registered host
memory like a transfer engine, MD's receiver and P's sender.

MD's `PackedReceiver.offer` reserves a landing region and returns the frame, P's `read_offer` attaches it to
a TransferInfo, `PackedSender.send` packs and "writes" (ctypes.memmove, after checking both ends lie in
registered memory), MD's `on_poll` unpacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from sglang_pdd.kernels.kv_pack_layout import FP8_MAX
from sglang_pdd.protocol.landing import ENTRY, decode_offer, decode_table
from sglang_pdd.transfer.packed_receiver import PackedReceiver
from sglang_pdd.transfer.packed_sender import METADATA_FRAMES, PackedSender, read_offer

from tests.fakes.kv_manager import FakeKVManager
from tests.fakes.kv_pool import MHATokenToKVPool

SENTINEL = -7.0
# The pools of these tests: 2 layers of 16 pages of 4 slots, 2 heads, K head dim 8, V head dim 4, random.
GEOMETRY = dict(layer_num=2, pages=16, page_size=4, head_num=2, head_dim=8, v_head_dim=4, seed=0)


def wan_pool(cls=MHATokenToKVPool, **kw) -> MHATokenToKVPool:
    """A pool of GEOMETRY, `kw` changed."""
    return cls(**{**GEOMETRY, **kw})


@dataclass
class Link:
    """P -> MD: P's and MD's managers and pools, MD's receiver, P's sender, and what each recorded."""

    p: FakeKVManager
    md: FakeKVManager
    rx: PackedReceiver
    tx: PackedSender
    rx_events: list = field(default_factory=list)
    tx_events: list = field(default_factory=list)

    def open_room(self, room: int, dst, session: str = "s", offer: bool = True):
        """MD offers a region for `dst`, P reads the offer off the TransferInfo message; returns the info."""
        frame = self.rx.offer(self.md, room, np.asarray(dst)) if offer else None
        info = SimpleNamespace(room=room, dst_kv_indices=np.asarray(dst, dtype=np.int32), is_dummy=False)
        read_offer(info, [b""] * METADATA_FRAMES + ([frame] if frame is not None else []))
        self.p.transfer_infos.setdefault(room, {})[session] = info
        return info

    def region(self, room: int) -> tuple[int, object]:
        """(offset of the room's region in MD's landing buffer, its offer)."""
        offer = decode_offer(self.rx._regions[room].frame)
        return offer.ptr - self.rx.buffer.data_ptr(), offer

    def table(self, room: int) -> list:
        off, offer = self.region(room)
        return decode_table(self.rx.buffer[off: off + offer.table_entries * ENTRY.size].numpy().tobytes(), offer.tag)

    def write_table(self, room: int, raw: bytes) -> None:
        off, _ = self.region(room)
        self.rx.buffer[off: off + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def page_by_page(self, src, dst) -> None:
        """What sglang's page-by-page write does: P's rows of `src` pages into MD's `dst` pages."""
        s, d = self.p.pool.slots(src), self.md.pool.slots(dst)
        for a, b in zip(self.p.pool.buffers(), self.md.pool.buffers()):
            b[d] = a[s]


def make_link(mode: str = "plain", page_size: int = 4, staging_bytes: int = PackedSender.DEFAULT_STAGING,
              arena_bytes: int = 1 << 20, dtype: torch.dtype = torch.float32, pool: dict | None = None,
              p_pool: dict | None = None, skip_unpack=lambda: False) -> Link:
    """`pool`: pool geometry of both sides (MHATokenToKVPool's arguments); `p_pool`: P's only (a mismatch).
    P's pool is random, MD's filled with SENTINEL."""
    geo = dict(page_size=page_size, dtype=dtype, **(pool or {}))
    p = FakeKVManager(wan_pool(**{**geo, **(p_pool or {}), "seed": 1}))
    md = FakeKVManager(wan_pool(**geo, fill=SENTINEL))
    p.peer = md
    link = Link(p, md, None, None)  # type: ignore[arg-type]
    link.rx = PackedReceiver(mode, arena_bytes, record=link.rx_events.append, skip_unpack=skip_unpack)
    link.tx = PackedSender(mode != "off", staging_bytes=staging_bytes, record=link.tx_events.append)
    return link


def assert_landed(link: Link, src, dst, fp8: bool) -> None:
    """MD's `dst` pages hold P's `src` pages: exactly (plain) or within e4m3 precision (fp8)."""
    s, d = link.p.pool.slots(src), link.md.pool.slots(dst)
    for a, b in zip(link.p.pool.buffers(), link.md.pool.buffers()):
        x, y = a[s], b[d]
        if not fp8:
            assert torch.equal(x, y)
            continue
        x, y = x.float(), y.float()
        amax = x.abs().amax(dim=-1, keepdim=True)
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-9 * scale below.
        bound = torch.maximum(x.abs() / 16, amax / FP8_MAX * 2**-9) + amax * 1e-6
        slack = 1e-3 * (a.dtype != torch.float32)
        assert bool(((x - y).abs() <= bound * 1.01 + slack).all())
        assert not torch.equal(y, torch.full_like(y, SENTINEL))


def assert_untouched(link: Link, before: list[torch.Tensor], dst) -> None:
    """Every MD row outside the `dst` pages is as it was."""
    keep = torch.ones(before[0].shape[0], dtype=torch.bool)
    keep[link.md.pool.slots(dst)] = False
    for old, new in zip(before, link.md.pool.buffers()):
        assert torch.equal(old[keep], new[keep]), "an MD row outside the destination pages changed"
