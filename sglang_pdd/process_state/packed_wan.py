"""The process's packed WAN endpoints (`--pdd-packed-wan`): P's sender and MD's receiver.

Each is made on first use from the process's config; `sending()` / `receiving()` say whether this
process packs (prefill) or unpacks (main) at all.
"""

from __future__ import annotations

import functools

from sglang_pdd.server import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.server.roles import Role
from sglang_pdd.transfer import controls
from sglang_pdd.transfer.packed_receiver import PackedReceiver
from sglang_pdd.transfer.packed_sender import PackedSender

@functools.lru_cache(maxsize=1)
def cfg() -> PddConfig:
    return PddConfig.from_env()


def sending() -> bool:
    return cfg().role is Role.PREFILL and cfg().packed_wan != "off"


def receiving() -> bool:
    return cfg().role is Role.MAIN and cfg().packed_wan != "off"


@functools.lru_cache(maxsize=1)
def sender() -> PackedSender:
    return PackedSender(sending(), staging_bytes=cfg().packed_staging_bytes,
                        record=lambda event: metrics.record_packed_wan("prefill", event))


@functools.lru_cache(maxsize=1)
def receiver() -> PackedReceiver:
    c = cfg()
    return PackedReceiver(c.packed_wan if receiving() else "off", c.packed_wan_mb << 20,
                          record=_record_main, skip_unpack=controls.for_process().skip_unpack)


def _record_main(event: str) -> None:
    metrics.record_packed_wan("main", event)
    r = receiver()
    if r.arena is not None:
        metrics.set_packed_wan_landing(r.arena.used(), r.rooms(), r.arena.quarantined())


def send_kvcache(manager, session_id, prefill_pages, dst_pages, **kw) -> int | None:
    """P's packed write of one chunk through the process's sender (None: page by page)."""
    if not sending() or kw.get("dst_device_kv_indices") is not None:
        return None
    return sender().send(manager, session_id, prefill_pages, dst_pages)
