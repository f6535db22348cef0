"""Packed WAN path hooks (`--pdd-packed-wan`): MD offers landing regions, P packs into them, MD unpacks.

    both  after  PrefillBootstrapQueue/DecodePreallocQueue._init_kv_manager   the manager's pool view
                 (and, for every PDD role, the start-up check of the pool's kind: supported.require_kv_pool)
    MD    around MooncakeKVManager.build_receiver_metadata_message           append the landing offer
    P     after  TransferInfo.from_zmq                                        read the offer
    P     (hooks/transfer.py around send_kvcache, process_state.packed_wan)   pack instead of page by page
    MD    around CommonKVReceiver.poll                                        unpack on the first Success
    MD    after  CommonKVReceiver.clear / abort                               free or quarantine the region

On sglang with patch 0004 the two metadata hooks are not registered (plugin.CAPABILITIES): MD's
offer is the `sglang-pdd.landing` transfer-metadata extension (`use_metadata_extension`) and P reads
it from `TransferInfo.extensions` (packed_sender.offer_of).

Inert unless the role is prefill (sender) or main (receiver) and the mode is not 'off'. The logic is in
sglang_pdd.transfer.packed_sender / packed_receiver; the process's sender and receiver live in
sglang_pdd.process_state.packed_wan.
"""

from __future__ import annotations

import logging

from sglang_pdd.server import supported
from sglang_pdd.process_state.packed_wan import cfg, receiver, receiving, sending
from sglang_pdd.transfer import kv_pool_view
from sglang_pdd.transfer.packed_receiver import FAILED, SUCCESS
from sglang_pdd.transfer.packed_sender import LANDING_EXTENSION, METADATA_FRAMES, read_offer

logger = logging.getLogger(__name__)


def after_init_kv_manager(manager, queue, *a, **kw):
    supported.require_kv_pool(cfg(), queue.token_to_kv_pool)  # every PDD role, at scheduler start-up
    if sending() or receiving():
        kv_pool_view.attach(manager, queue.token_to_kv_pool)
        kv_pool_view.warm_up(manager, fp8=cfg().packed_wan == "fp8")
    return manager


def around_build_receiver_metadata_message(original, manager, *a, **kw):
    msg = original(manager, *a, **kw)
    if not receiving() or kw.get("is_dummy") or len(msg) != METADATA_FRAMES:
        return msg
    try:
        frame = receiver().offer(manager, kw["bootstrap_room"], kw["kv_indices"])
    except Exception:  # the room goes page by page; sglang's message is sent as it was
        logger.exception("room %s: no landing offer", kw.get("bootstrap_room"))
        return msg
    return msg if frame is None else [*msg, frame]


class LandingExtension:
    """MD's landing offer as sglang's transfer-metadata extension (patch 0004); None: page by page."""

    name = LANDING_EXTENSION

    def build(self, kv_mgr, *, bootstrap_room, kv_indices, aux_index):
        return receiver().offer(kv_mgr, bootstrap_room, kv_indices) if receiving() else None


def use_metadata_extension() -> None:
    from sglang.srt.disaggregation.base.metadata_extensions import register_transfer_metadata_extension

    register_transfer_metadata_extension(_EXTENSION)


_EXTENSION = LandingExtension()


def after_transfer_info_from_zmq(info, cls, msg, *a, **kw):
    if sending():
        read_offer(info, msg)
    return info


def around_receiver_poll(original, rx, *a, **kw):
    status = original(rx, *a, **kw)
    if not receiving() or status not in (SUCCESS, FAILED):
        return status
    new, reason = receiver().on_poll(rx.kv_mgr, rx.bootstrap_room, int(status))
    if new == status:
        return status
    rx.kv_mgr.record_failure(rx.bootstrap_room, reason)
    rx.conclude_state = type(status)(FAILED)
    return rx.conclude_state


def after_receiver_release(_result, rx, *a, **kw):
    if receiving():
        receiver().release(rx.bootstrap_room)
