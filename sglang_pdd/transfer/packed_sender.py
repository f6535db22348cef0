"""Prefill's side of the packed WAN path: a chunk's pages as a few large writes into MD's landing region.

sglang's transfer worker calls `send_kvcache(session, prefill_pages, ..., dst_pages)` once per chunk
and peer; with a landing offer from that peer, `PackedSender.send` replaces the page-by-page write:

* find the room: the one live `TransferInfo` of that session whose offer covers exactly these
  destination pages (MD's pages of live rooms are disjoint; anything ambiguous goes page by page);
* pack the pages (all layers, K and V; `kernels.pack_kv`) into this worker's registered staging buffer,
  in blocks of at most `staging_bytes`, and write each block plus its table entry with one batch write.

It returns None, and the caller writes page by page as sglang would, whenever it cannot pack: the mode
is off, no offer, a geometry that differs from the offer's, a region too small. The page-by-page
pages need nothing from MD: the table names only the blocks.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np
import torch

from sglang_pdd.kernels.kv_pack import pack_kv
from sglang_pdd.protocol.landing import ENTRY, BlockEntry, LandingError, LandingOffer, align_up, decode_offer
from sglang_pdd.transfer.kv_pool_view import KVPoolView, view_of

logger = logging.getLogger(__name__)

OFFER_ATTR = "_pdd_landing"  # on sglang's TransferInfo: the LandingOffer its message carried
_CURSOR_ATTR = "_pdd_landing_cursor"  # [entries written, data bytes used]
_INDEX_ATTR = "_pdd_landing_index"  # {destination page: position}
METADATA_FRAMES = 10  # frames of sglang's TransferInfo message; a landing frame follows them
HEADER = 64  # staging bytes before the block: its table entry, padded


LANDING_EXTENSION = "sglang-pdd.landing"  # the offer's name as a transfer-metadata extension (patch 0004)
_UNREAD = object()


def read_offer(info: Any, msg: list) -> None:
    """Attach the landing offer of a TransferInfo message (frame 10), if it carries a usable one."""
    if len(msg) <= METADATA_FRAMES or getattr(info, "is_dummy", False):
        return
    offer = _checked_offer(info, bytes(msg[METADATA_FRAMES]))
    if offer is not None:
        setattr(info, OFFER_ATTR, offer)


def offer_of(info: Any) -> LandingOffer | None:
    """The TransferInfo's landing offer: the one `read_offer` attached (stock sglang), else the one
    in its `extensions` (sglang with patch 0004), decoded once."""
    offer = getattr(info, OFFER_ATTR, _UNREAD)
    if offer is _UNREAD:
        frame = (getattr(info, "extensions", None) or {}).get(LANDING_EXTENSION)
        offer = None if frame is None or getattr(info, "is_dummy", False) else _checked_offer(info, frame)
        setattr(info, OFFER_ATTR, offer)
    return offer


def _checked_offer(info: Any, frame: bytes) -> LandingOffer | None:
    try:
        offer = decode_offer(bytes(frame))
    except LandingError as e:
        logger.warning("room %s: landing offer ignored (page-by-page transfer): %s", info.room, e)
        return None
    if offer is not None and offer.num_pages != len(info.dst_kv_indices):
        logger.warning("room %s: landing offer for %d pages, the message names %d: ignored", info.room,
                       offer.num_pages, len(info.dst_kv_indices))
        return None
    return offer


class PackedSender:
    DEFAULT_STAGING = 64 << 20

    def __init__(self, enabled: bool, staging_bytes: int = DEFAULT_STAGING,
                 record: Callable[[str], None] = lambda event: None):
        self.enabled = enabled
        self.staging_bytes = staging_bytes
        self._record = record
        self._local = threading.local()

    def send(self, manager: Any, session_id: str, prefill_pages: Any, dst_pages: Any) -> int | None:
        """The write's status (0 = done) when it went packed; None: write it page by page."""
        if not self.enabled or len(prefill_pages) == 0 or len(prefill_pages) != len(dst_pages):
            return None
        found = self._find(manager, session_id, np.asarray(dst_pages))
        if found is None:
            return None
        info, offer, pos = found
        view = view_of(manager)
        if not isinstance(view, KVPoolView):
            return self._fallback(f"pool: {view}")
        if view.geometry() != offer.geometry():
            return self._fallback("geometry")
        plan = self._plan(view, offer, getattr(info, _CURSOR_ATTR, (0, 0)), pos, len(prefill_pages))
        if plan is None:
            return self._fallback("region full")
        pages = np.asarray(prefill_pages)
        for slot, entry, index, nbytes in plan:
            try:
                staging = self._pack(manager, view, offer, pages[index], entry, nbytes)
            except Exception:  # never sglang's transfer worker (it would take the prefill down)
                logger.exception("packing a chunk failed; this chunk goes page by page")
                return self._fallback("pack error")  # blocks already written hold the same bytes
            ret = self._write(manager, session_id, offer, staging, slot, entry, nbytes)
            if ret != 0:
                return ret
            setattr(info, _CURSOR_ATTR, (slot + 1, entry.byte_off + nbytes))
        self._record("packed")
        return 0

    # -- internals ------------------------------------------------------------------------------

    def _fallback(self, reason: str) -> None:
        self._record(f"page by page: {reason}")
        return None

    def _find(self, manager: Any, session_id: str, dst: np.ndarray) -> tuple | None:
        for _ in range(3):  # the bootstrap thread adds rooms while we look
            try:
                rooms = list(manager.transfer_infos.items())
                break
            except RuntimeError:
                continue
        else:
            return None
        first, n, hits = int(dst[0]), len(dst), []
        for _room, infos in rooms:
            info = infos.get(session_id) if isinstance(infos, dict) else None
            offer = None if info is None else offer_of(info)
            if offer is None:
                continue
            index = getattr(info, _INDEX_ATTR, None)
            if index is None:
                index = {int(p): i for i, p in enumerate(info.dst_kv_indices)}
                setattr(info, _INDEX_ATTR, index)
            pos = index.get(first)
            if pos is not None and np.array_equal(info.dst_kv_indices[pos: pos + n], dst):
                hits.append((info, offer, pos))
        if len(hits) != 1:
            if hits:
                self._record("page by page: ambiguous pages")
            return None
        return hits[0]

    def _plan(self, view: KVPoolView, offer: LandingOffer, cursor: tuple, pos: int, n: int) -> list | None:
        """[(table slot, entry, page slice, block bytes)] for the chunk; None when it does not fit."""
        step = max(1, self.staging_bytes // view.layout(1, offer.fp8).nbytes)
        entries, used, plan = cursor[0], cursor[1], []
        for i in range(0, n, step):
            k = min(step, n - i)
            nbytes = view.layout(k, offer.fp8).nbytes
            off = align_up(used)
            if entries >= offer.table_entries or off + nbytes > offer.data_size:
                return None
            plan.append((entries, BlockEntry(pos + i, k, off), slice(i, i + k), nbytes))
            entries, used = entries + 1, off + nbytes
        return plan

    def _pack(self, manager: Any, view: KVPoolView, offer: LandingOffer, pages: np.ndarray, entry: BlockEntry,
              nbytes: int) -> torch.Tensor:
        """The registered staging buffer holding the block's table entry, then the block."""
        staging = self._staging(manager, HEADER + nbytes)
        staging[:ENTRY.size] = torch.frombuffer(bytearray(entry.encode(offer.tag)), dtype=torch.uint8)
        slots = view.slots(pages)
        if view.device.type == "cpu":
            pack_kv(view.k, view.v, slots, fp8=offer.fp8, out=staging[HEADER: HEADER + nbytes])
        else:
            packed, _ = pack_kv(view.k, view.v, slots, fp8=offer.fp8)
            staging[HEADER: HEADER + nbytes].copy_(packed)
        return staging

    @staticmethod
    def _write(manager: Any, session_id: str, offer: LandingOffer, staging: torch.Tensor, slot: int,
               entry: BlockEntry, nbytes: int) -> int:
        """One batch write of two slices: the block into the data area, its entry into the table."""
        base = staging.data_ptr()
        return manager._transfer_data(session_id, [
            (base + HEADER, offer.ptr + offer.data_off + entry.byte_off, nbytes),
            (base, offer.ptr + slot * ENTRY.size, ENTRY.size),
        ])

    def _staging(self, manager: Any, nbytes: int) -> torch.Tensor:
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = {}
        buf = bufs.get(id(manager))
        if buf is None or buf.numel() < nbytes:
            if buf is not None:
                manager.engine.deregister(buf.data_ptr())
            size = max(nbytes, 8 << 20)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            manager.engine.register(buf.data_ptr(), size)
            bufs[id(manager)] = buf
        return buf
