"""Packed WAN path hooks (`--pdd-packed-wan`): MD offers landing regions, P packs into them, MD unpacks.

    both  after  PrefillBootstrapQueue/DecodePreallocQueue._init_kv_manager   the manager's pool view
    MD    around MooncakeKVManager.build_receiver_metadata_message           append the landing offer
    P     after  TransferInfo.from_zmq                                        read the offer
    P     (hooks/transfer.py around send_kvcache)                             pack instead of page by page
    MD    around CommonKVReceiver.poll                                        unpack on the first Success
    MD    after  CommonKVReceiver.clear / abort                               free or quarantine the region

Inert unless the role is prefill (sender) or main (receiver) and the mode is not 'off'. The logic is in
sglang_pdd.transfer.packed_sender / packed_receiver.
"""

from __future__ import annotations

import functools
import logging

from sglang_pdd import metrics, test_switches
from sglang_pdd.config import PddConfig
from sglang_pdd.roles import Role
from sglang_pdd.transfer import kv_pool_view
from sglang_pdd.transfer.packed_receiver import FAILED, SUCCESS, PackedReceiver
from sglang_pdd.transfer.packed_sender import METADATA_FRAMES, PackedSender, read_offer

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _cfg() -> PddConfig:
    return PddConfig.from_env()


def _sending() -> bool:
    return _cfg().role is Role.PREFILL and _cfg().packed_wan != "off"


def _receiving() -> bool:
    return _cfg().role is Role.MAIN and _cfg().packed_wan != "off"


@functools.lru_cache(maxsize=1)
def sender() -> PackedSender:
    return PackedSender(_sending(), staging_bytes=_cfg().packed_staging_bytes,
                        record=lambda event: metrics.record_packed_wan("prefill", event))


@functools.lru_cache(maxsize=1)
def receiver() -> PackedReceiver:
    cfg, switches = _cfg(), test_switches.for_process()
    return PackedReceiver(cfg.packed_wan if _receiving() else "off", cfg.packed_wan_mb << 20,
                          record=_record_main,
                          skip_unpack=lambda: switches.on and switches.knobs().packed_skip_unpack)


def _record_main(event: str) -> None:
    metrics.record_packed_wan("main", event)
    r = receiver()
    if r.arena is not None:
        metrics.set_packed_wan_landing(r.arena.used(), r.rooms(), r.arena.quarantined())


def after_init_kv_manager(manager, queue, *a, **kw):
    if _sending() or _receiving():
        kv_pool_view.attach(manager, queue.token_to_kv_pool)
        kv_pool_view.warm_up(manager, fp8=_cfg().packed_wan == "fp8")
    return manager


def around_build_receiver_metadata_message(original, manager, *a, **kw):
    msg = original(manager, *a, **kw)
    if not _receiving() or kw.get("is_dummy") or len(msg) != METADATA_FRAMES:
        return msg
    try:
        frame = receiver().offer(manager, kw["bootstrap_room"], kw["kv_indices"])
    except Exception:  # the room goes page by page; sglang's message is sent as it was
        logger.exception("room %s: no landing offer", kw.get("bootstrap_room"))
        return msg
    return msg if frame is None else [*msg, frame]


def after_transfer_info_from_zmq(info, cls, msg, *a, **kw):
    if _sending():
        read_offer(info, msg)
    return info


def send_kvcache(manager, session_id, prefill_pages, dst_pages, **kw) -> int | None:
    """P's packed write of one chunk (None: page by page); called by hooks/transfer.around_send_kvcache."""
    if not _sending() or kw.get("dst_device_kv_indices") is not None:
        return None
    return sender().send(manager, session_id, prefill_pages, dst_pages)


def around_receiver_poll(original, rx, *a, **kw):
    status = original(rx, *a, **kw)
    if not _receiving() or status not in (SUCCESS, FAILED):
        return status
    new, reason = receiver().on_poll(rx.kv_mgr, rx.bootstrap_room, int(status))
    if new == status:
        return status
    rx.kv_mgr.record_failure(rx.bootstrap_room, reason)
    rx.conclude_state = type(status)(FAILED)
    return rx.conclude_state


def after_receiver_release(_result, rx, *a, **kw):
    if _receiving():
        receiver().release(rx.bootstrap_room)
