"""Fakes for the packed WAN path tests (no sglang, no Mooncake): the KV pool, a KV manager whose
`_transfer_data` moves bytes between registered host memory like a transfer engine, and a P -> MD link.

The real path runs end to end in one process: MD's `PackedReceiver.offer` reserves a landing region and
returns the frame, P's `read_offer` attaches it to a TransferInfo, `PackedSender.send` packs and "writes"
(ctypes.memmove, after checking both ends lie in registered memory), MD's `on_poll` unpacks.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from sglang_pdd.kernels.kv_pack_layout import FP8_MAX
from sglang_pdd.protocol.landing import ENTRY, decode_offer, decode_table
from sglang_pdd.transfer.kv_pool_view import attach
from sglang_pdd.transfer.packed_receiver import PackedReceiver
from sglang_pdd.transfer.packed_sender import METADATA_FRAMES, PackedSender, read_offer

SENTINEL = -7.0


class MHATokenToKVPool:
    """Stands in for sglang's pool: `KVPoolView.of` accepts a pool by this class name."""

    def __init__(self, layers: int = 2, pages: int = 16, page_size: int = 4, heads: int = 2, dim: int = 8,
                 v_dim: int = 4, dtype: torch.dtype = torch.float32, seed: int = 0, fill: float | None = None):
        slots = pages * page_size
        gen = torch.Generator().manual_seed(seed)

        def buf(d: int) -> torch.Tensor:
            if fill is not None:
                return torch.full((slots, heads, d), fill, dtype=dtype)
            return torch.randn((slots, heads, d), generator=gen).to(dtype)

        self.k_buffer = [buf(dim) for _ in range(layers)]
        self.v_buffer = [buf(v_dim) for _ in range(layers)]
        self.dtype = self.store_dtype = dtype
        self.page_size = page_size

    def slots(self, pages) -> torch.Tensor:
        p = torch.as_tensor(np.asarray(pages, dtype=np.int64))
        return (p[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.k_buffer + self.v_buffer]

    def buffers(self) -> list[torch.Tensor]:
        return self.k_buffer + self.v_buffer


class FakeEngine:
    def __init__(self):
        self.regions: dict[int, int] = {}
        self.calls: list[tuple] = []

    def register(self, ptr: int, nbytes: int) -> None:
        self.calls.append(("register", ptr, nbytes))
        self.regions[ptr] = nbytes

    def deregister(self, ptr: int) -> None:
        self.calls.append(("deregister", ptr))
        del self.regions[ptr]

    def holds(self, ptr: int, nbytes: int) -> bool:
        return any(p <= ptr and ptr + nbytes <= p + n for p, n in self.regions.items())


class FakeKVManager:
    def __init__(self, pool: MHATokenToKVPool, attn_tp_size: int = 1, pp_size: int = 1):
        self.pool = pool
        self.engine = FakeEngine()
        self.transfer_infos: dict[int, dict] = {}
        self.attn_tp_size, self.pp_size = attn_tp_size, pp_size
        self.kv_args = SimpleNamespace(kv_data_ptrs=[t.data_ptr() for t in pool.buffers()])
        self.peer: FakeKVManager | None = None
        self.batches: list[list[tuple[int, int, int]]] = []
        self.fail_from: int | None = None  # batches from this index on fail (-1)
        attach(self, pool)

    def _transfer_data(self, session_id: str, blocks: list) -> int:
        self.batches.append(list(blocks))
        if self.fail_from is not None and len(self.batches) > self.fail_from:
            return -1
        for src, dst, n in blocks:
            assert self.engine.holds(src, n), "source outside this side's registered memory"
            assert self.peer is not None and self.peer.engine.holds(dst, n), "destination outside the peer's"
        for src, dst, n in blocks:
            ctypes.memmove(dst, src, n)
        return 0


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
    """`pool`: pool geometry of both sides; `p_pool`: P's only (a mismatch)."""
    geo = dict(page_size=page_size, dtype=dtype, **(pool or {}))
    p = FakeKVManager(MHATokenToKVPool(seed=1, **{**geo, **(p_pool or {})}))
    md = FakeKVManager(MHATokenToKVPool(fill=SENTINEL, **geo))
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
