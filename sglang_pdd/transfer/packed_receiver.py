"""MainDecode's side of the packed WAN path: offer a landing region per room, unpack it on success.

* `offer(manager, room, pages)`: when MD's receiver tells P where a room's pages are, reserve a region
  for them in the landing arena (registered with MD's transfer engine once) and return the frame to
  append to that message. None (page by page) when the mode is off, the pool does not qualify, or the
  arena is full: packing is an optimisation, never a reason to fail.
* `on_poll(receiver, status)`: the first time a room with a region polls Success, scatter every block
  P wrote into the room's pages, then free the region. A corrupt table fails that one request.
* `release(room)`: a room that failed or was aborted quarantines its region (P may still be writing).

Plain logic over the manager's pool view (`kv_pool_view`); the sglang hooks are in hooks/packed_wan.py.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from sglang_pdd.kernels.kv_pack import unpack_kv
from sglang_pdd.protocol.landing import (ENTRY, BlockEntry, LandingError, LandingOffer, align_up, block_tag,
                                         decode_table, encode_offer)
from sglang_pdd.transfer.kv_pool_view import KVPoolView, view_of
from sglang_pdd.transfer.landing_arena import LandingArena

logger = logging.getLogger(__name__)

SUCCESS, FAILED = 4, 0  # sglang's KVPoll values (pinned in tests/unit/transfer/test_fanout_sender.py)
BLOCK_SLACK = 128  # per block: alignment of its start and of its regions (see region_size)


def region_size(view: KVPoolView, num_pages: int, fp8: bool) -> tuple[int, int, int]:
    """(table entries, data offset, region bytes) for a room of `num_pages` pages: at most one block
    per page, each block at most its share of the whole layout plus alignment."""
    entries = num_pages
    data_off = align_up(entries * ENTRY.size)
    return entries, data_off, data_off + view.layout(num_pages, fp8).nbytes + BLOCK_SLACK * num_pages


@dataclass
class _Region:
    off: int
    size: int
    offer: LandingOffer
    pages: np.ndarray
    frame: bytes


class PackedReceiver:
    def __init__(self, mode: str, arena_bytes: int, record: Callable[[str], None] = lambda event: None,
                 skip_unpack: Callable[[], bool] = lambda: False):
        self.mode = mode
        self.arena = LandingArena(arena_bytes) if mode != "off" else None
        self.buffer: torch.Tensor | None = None
        self._registered: set[int] = set()  # engines (id) the buffer is registered with
        self._regions: dict[int, _Region] = {}
        self._generation = 0  # offers made so far: with the room, it draws each offer's block tag
        self._lock = threading.Lock()
        self._record = record
        self._skip_unpack = skip_unpack  # a negative control, off but in tests (transfer/controls.py)

    def offer(self, manager: Any, room: int, pages: np.ndarray) -> bytes | None:
        if self.arena is None or len(pages) == 0:
            return None
        with self._lock:
            region = self._regions.get(room)
            if region is not None:  # a message per prefill rank: the same region
                return region.frame
            view = view_of(manager)
            if not isinstance(view, KVPoolView):
                self._refuse(view)
                return None
            fp8 = self.mode == "fp8"
            entries, data_off, size = region_size(view, len(pages), fp8)
            off = self.arena.alloc(size)
            if off is None:
                self._refuse("arena full")
                return None
            try:
                buf = self._buffer()
                self._register(manager, buf)
            except Exception:
                self.arena.free(off, size)
                raise
            buf[off: off + data_off].zero_()  # an empty block table
            geo = view.geometry()
            offer = LandingOffer(ptr=buf.data_ptr() + off, size=size, table_entries=entries, data_off=data_off,
                                 page_size=geo[0], num_pages=len(pages), layers=geo[1], k_heads=geo[2],
                                 k_head_dim=geo[3], v_heads=geo[4], v_head_dim=geo[5], dtype=geo[6], fp8=fp8,
                                 tag=block_tag(room, self._generation))
            self._generation += 1
            frame = encode_offer(offer)
            self._regions[room] = _Region(off, size, offer, np.array(pages, dtype=np.int64), frame)
        self._record("offered")
        return frame

    def on_poll(self, manager: Any, room: int, status: int) -> tuple[int, str | None]:
        """(status to report, failure reason); unpacks on the room's first Success."""
        if status not in (SUCCESS, FAILED):
            return status, None
        with self._lock:
            region = self._regions.pop(room, None)
        if region is None:
            return status, None
        if status == FAILED:
            self.arena.quarantine(region.off, region.size)
            self._record("failed")
            return status, None
        try:
            blocks = self._unpack(manager, region)
        except Exception as e:  # a bad table or a kernel error ends this request, never the scheduler
            self.arena.quarantine(region.off, region.size)
            self._record("corrupt")
            logger.error("room %s: packed KV could not be unpacked: %s", room, e)
            return FAILED, f"packed KV transfer could not be unpacked: {e}"
        self.arena.free(region.off, region.size)
        self._record("unpacked" if blocks else "unused")
        return status, None

    def release(self, room: int) -> None:
        with self._lock:
            region = self._regions.pop(room, None)
        if region is not None:
            self.arena.quarantine(region.off, region.size)
            self._record("released")

    def rooms(self) -> int:
        with self._lock:
            return len(self._regions)

    # -- internals ------------------------------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        self._record(f"not offered: {reason}")

    def _buffer(self) -> torch.Tensor:
        if self.buffer is None:
            pin = torch.cuda.is_available()
            self.buffer = torch.empty(self.arena.nbytes, dtype=torch.uint8, pin_memory=pin)
        return self.buffer

    def _register(self, manager: Any, buf: torch.Tensor) -> None:
        engine = getattr(manager, "engine", None)
        if engine is not None and id(engine) not in self._registered:
            engine.register(buf.data_ptr(), buf.numel())
            self._registered.add(id(engine))

    def _unpack(self, manager: Any, region: _Region) -> int:
        view = view_of(manager)
        if not isinstance(view, KVPoolView):
            raise LandingError(f"the pool view is gone: {view}")
        base = region.off
        offer = region.offer
        table = self.buffer[base: base + offer.table_entries * ENTRY.size].numpy().tobytes()
        entries = decode_table(table, offer.tag)
        if self._skip_unpack():
            return 0
        covered = np.zeros(offer.num_pages, dtype=bool)
        end = 0
        for e in entries:
            nbytes = view.layout(e.n_pages, offer.fp8).nbytes if e.n_pages > 0 else 0
            self._check(e, offer, covered, end, nbytes)
            start = base + offer.data_off + e.byte_off
            block = self.buffer[start: start + nbytes].to(view.device)
            unpack_kv(block, view.k, view.v, view.slots(region.pages[e.pos_page: e.pos_page + e.n_pages]),
                      fp8=offer.fp8)
            covered[e.pos_page: e.pos_page + e.n_pages] = True
            end = e.byte_off + nbytes
        return len(entries)

    @staticmethod
    def _check(e: BlockEntry, offer: LandingOffer, covered: np.ndarray, end: int, nbytes: int) -> None:
        if not (0 <= e.pos_page and 1 <= e.n_pages and e.pos_page + e.n_pages <= offer.num_pages):
            raise LandingError(f"block {e} outside the room's {offer.num_pages} pages")
        if covered[e.pos_page: e.pos_page + e.n_pages].any():
            raise LandingError(f"block {e} overlaps an earlier block")
        if e.byte_off < end or e.byte_off % 64:
            raise LandingError(f"block {e} overlaps the previous block or is misaligned")
        if e.byte_off + nbytes > offer.data_size:
            raise LandingError(f"block {e} of {nbytes} bytes ends past the data area ({offer.data_size} bytes)")
