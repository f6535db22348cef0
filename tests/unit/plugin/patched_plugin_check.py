"""Run by tests/unit/plugin/test_patches.py with the patched sglang first on PYTHONPATH (not a pytest module).

Checks that the plugin serves each ported capability through sglang's own classes there:
* 0002: P's fan-out is sglang's KV destinations provider: `create_sender` builds a
  `MultiDestinationKVSender` with MD's room, the fan-out registry follows it open and closed, and a
  malformed `pdd` parameter is a 400 whose rooms P refuses;
* 0004: MD's landing offer, registered as a transfer-metadata extension, travels in sglang's
  metadata message and P's sender finds it in `TransferInfo.extensions`, with no hook;
* 0003: sglang's decode scheduler builds the plugin's `DecodeExtension` for a relay or main
  scheduler (none for a plain decode), and its six call sites reach the decode runtime: a queued
  request admitted, a poll after the decode queues, the runtime's batch run first, its result
  consumed, its held work keeping the scheduler busy, an abort passed on;
* 0005: the plugin's idle wait is sglang's `IdleWaiter`: a socket the token channel watches and the
  plugin's wake-ups end sglang's wait, and `--pdd-idle-wait-ms` becomes sglang's `--idle-wait-ms`.
Prints "PLUGIN CHECKS OK" and exits 0 when every check holds.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import sglang

from sglang_pdd import plugin
from sglang_pdd.hooks import packed_wan as packed_hooks
from sglang_pdd.protocol.landing import LandingOffer, block_tag, encode_offer
from sglang_pdd.transfer.packed_sender import LANDING_EXTENSION, PackedSender, offer_of

ROOM, SESSION = 7, "10.0.0.2:17001"


def check_capabilities() -> None:
    caps = plugin.capability_paths()
    assert all(caps.values()), caps
    retired = {t for c in plugin.CAPABILITIES for t in c.retires}
    assert not retired & {h.target for h in plugin.active_hooks() if h.retirable}
    print(f"capabilities {caps}; {len(plugin.active_hooks())}/{len(plugin.HOOKS)} hooks registered")


def check_landing_extension() -> None:
    from sglang.srt.disaggregation.base.metadata_extensions import registered_transfer_metadata_extensions
    from sglang.srt.disaggregation.mooncake.conn import (METADATA_MESSAGE_FIXED_FRAMES, MooncakeKVManager,
                                                         TransferInfo)

    plugin.use_capabilities()
    assert registered_transfer_metadata_extensions() == [LANDING_EXTENSION]
    offer = LandingOffer(ptr=1 << 20, size=4096, table_entries=3, data_off=128, page_size=4, num_pages=3,
                         layers=2, k_heads=2, k_head_dim=8, v_heads=2, v_head_dim=4, dtype="float16",
                         tag=block_tag(ROOM, 0))
    offered = []

    class Receiver:
        def offer(self, manager, room, pages):
            offered.append((room, list(pages)))
            return encode_offer(offer)

    packed_hooks.receiving, packed_hooks.receiver = (lambda: True), Receiver  # MD with --pdd-packed-wan
    md = SimpleNamespace(local_ip="10.0.0.2", rank_port=17000, get_session_id=lambda: SESSION)

    def message(is_dummy=False):
        return MooncakeKVManager.build_receiver_metadata_message(
            md, bootstrap_room=ROOM, required_dst_info_num=1, kv_indices=np.array([3, 4, 5], dtype=np.int32),
            aux_index=2, state_indices=None, decode_prefix_len=0, is_dummy=is_dummy)

    msg = message()
    assert len(msg) == METADATA_MESSAGE_FIXED_FRAMES + 2 and offered == [(ROOM, [3, 4, 5])], (len(msg), offered)
    info = TransferInfo.from_zmq(msg)
    assert offer_of(info) == offer
    p = SimpleNamespace(transfer_infos={ROOM: {SESSION: info}})
    found = PackedSender(True)._find(p, SESSION, np.array([4, 5]))
    assert found is not None and found[1] == offer and found[2] == 1, found
    assert len(message(is_dummy=True)) == METADATA_MESSAGE_FIXED_FRAMES  # no offer for a dummy rank
    packed_hooks.receiving = lambda: False
    assert len(message()) == METADATA_MESSAGE_FIXED_FRAMES  # not MD (or the mode is off): no extension
    print("0004: the landing offer travels as a transfer-metadata extension")


class _Sender:
    def __init__(self, mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank):
        self.bootstrap_room, self.bootstrap_server_url = bootstrap_room, bootstrap_addr
        self.cleared = False

    def poll(self):
        return 1  # Bootstrapping

    def clear(self):
        self.cleared = True

    def abort(self):
        pass


def check_destinations_provider() -> None:
    import threading
    from http import HTTPStatus
    from unittest.mock import MagicMock, patch

    from sglang.srt.disaggregation import prefill as prefill_mod
    from sglang.srt.disaggregation.common.multi_destination import MultiDestinationKVSender

    from sglang_pdd.process_state import fanout
    from sglang_pdd.transfer.mooncake_fanout import FanoutBuilder

    plugin.use_capabilities()
    assert prefill_mod._kv_destinations_provider is not None
    fanout.builder = lambda: FanoutBuilder(fanout.REGISTRY, 5.0)  # P (--pdd-role prefill)
    kv = SimpleNamespace(failure_lock=threading.Lock(), failure_records={}, transfer_infos={},
                         req_to_decode_prefix_len={}, request_status={}, _room_notify_targets=lambda room: [])
    q = MagicMock(queue=[], kv_manager=kv, bootstrap_port=8998)
    q.scheduler.disagg_prefill_inflight_queue = []
    q._check_if_req_exceed_kv_capacity.return_value = False
    q._check_kv_destinations = prefill_mod.PrefillBootstrapQueue._check_kv_destinations
    q._create_multi_destination_sender = (
        lambda *a: prefill_mod.PrefillBootstrapQueue._create_multi_destination_sender(q, *a))
    q.scheduler.token_to_kv_pool_allocator.page_size = 4

    def create(room, pdd):
        req = SimpleNamespace(rid=f"r{room}", bootstrap_host="10.0.0.1", bootstrap_room=room,
                              disagg_prefill_dp_rank=None, return_logprob=False,
                              sampling_params=SimpleNamespace(custom_params=pdd and {"pdd": pdd}))
        with patch.object(prefill_mod, "get_kv_class", return_value=_Sender), \
                patch.object(prefill_mod, "prepare_abort") as abort:
            return prefill_mod.PrefillBootstrapQueue.create_sender(q, req, 1), req, abort

    ok, req, _ = create(1, {"v": 1, "main_room": 7})
    sender = req.disagg_kv_sender
    assert ok and isinstance(sender, MultiDestinationKVSender) and list(sender.destination_status()) == [7]
    assert sender.bootstrap_room == 1 and fanout.REGISTRY.is_main(7) and fanout.REGISTRY.is_relay(1)
    assert sender.destination_status()[7].state.value == "waiting"
    ok2, _, abort = create(2, {"v": 1, "main_room": 7})  # MD's room of a fan-out in flight
    assert not ok2 and abort.call_args.kwargs["status_code"] == HTTPStatus.BAD_REQUEST, abort.call_args
    assert "already serves" in abort.call_args.args[1] and fanout.REGISTRY.refuses(2)
    sender.clear()  # P releases the request: MD's room is closed, a late registration refused
    assert not fanout.REGISTRY.is_main(7) and fanout.REGISTRY.refuses(7)
    ok3, req3, _ = create(3, None)
    assert ok3 and isinstance(req3.disagg_kv_sender, _Sender)  # plain PD: one sender
    print("0002: P's fan-out is sglang's KV destinations provider")


def check_decode_extension() -> None:
    from unittest.mock import MagicMock

    from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin as DecodeMixin
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_pdd.decode import extension as decode_extension
    from sglang_pdd.server import metrics

    from tests.fakes.decode_role import RecordingRole

    metrics.publish_pool_state = lambda role, scheduler: None
    plugin.use_capabilities()
    decode = dict(disaggregation_mode=DisaggregationMode.DECODE, scheduler_stage_metrics=None)
    plain = SimpleNamespace(**decode)  # a decode server without --pdd-role: no extension
    Scheduler.init_decode_scheduler_extension(plain)
    assert plain.decode_extension is None and decode_extension.path(plain) is None
    s = MagicMock(**decode, waiting_queue=[], chunked_req=None, mm_receiver=None, dllm_config=None,
                  enable_overlap=False, last_batch=None, decode_offload_manager=None, enable_hisparse=False,
                  enable_hierarchical_cache=False, enable_lmcache=False, _engine_paused=False)
    chunk = MagicMock(reqs=[])
    chunk.name = "chunk"
    s._pdd_runtime = role = RecordingRole(s, batch=chunk)  # MD's runtime (decode.runtime.runtime finds it)
    Scheduler.init_decode_scheduler_extension(s)
    assert isinstance(s.decode_extension, decode_extension.DecodeExtension) and s.decode_extension.role is role
    assert decode_extension.path(s) == "extension"
    s._set_or_validate_priority.return_value = True
    Scheduler._add_request_to_queue(s, SimpleNamespace(rid="a", finished=lambda: False, time_stats=MagicMock()))
    s._process_decode_queues = lambda: role.calls.append(("queues",))
    DecodeMixin.process_decode_queue(s)
    s.dp_attn_adapter.maybe_prepare_mlp_sync_batch.side_effect = lambda b: b
    running = MagicMock()
    plan = DecodeMixin.get_next_disagg_decode_batch_to_run(s, running)
    assert plan.batch_to_run is role.batch and plan.running_batch is running
    Scheduler.process_batch_result(s, role.batch, "result")  # a catch-up chunk's: consumed
    assert not s.publish_load_snapshot.called and not s.batch_result_processor.process_batch_result_decode.called
    s.running_batch.is_empty.return_value, s.waiting_queue, s.grammar_manager.grammar_queue = True, [], []
    s.dllm_manager.any_staging_reqs.return_value = False
    s._pp_microbatches_drained.return_value = True
    for q in (s.disagg_decode_prealloc_queue, s.disagg_decode_transfer_queue):
        q.queue, q.retracted_queue = [], []
    s.disagg_decode_transfer_queue.has_pending_deferred_releases.return_value = False
    role.held = True
    assert Scheduler.is_fully_idle(s) is False  # a held request
    role.held = False
    assert Scheduler.is_fully_idle(s) is True
    s.collect_inflight_reqs.return_value = []
    Scheduler.abort_request(s, AbortReq(rid="a", abort_message="client left"))
    assert role.calls == [("admit", "a"), ("queues",), ("poll",), ("next_batch", running),
                          ("result", "chunk", "result"), ("abort", "a", "client left", False)], role.calls
    print("0003: sglang's decode scheduler calls the decode runtime through the plugin's extension")


def check_idle_wait() -> None:
    import os

    from sglang.srt.managers.scheduler_components.idle_waiter import IdleWaiter
    from sglang.srt.server_args import ServerArgs

    from sglang_pdd.server import idle_wait
    from sglang_pdd.config import PddConfig
    from sglang_pdd.server.idle_wait import configure_server_args

    idle_wait.reset_for_tests()
    plugin.use_capabilities()
    waiter = IdleWaiter([], timeout_ms=0)  # what the scheduler builds with --idle-wait-ms
    assert waiter.wait() is False
    r, w = os.pipe()
    try:
        idle_wait.watch(SimpleNamespace(idle_sleeper=None), r)  # as RLD's / MD's token channel does
        os.write(w, b"x")
        assert waiter.wait() is True
        os.read(r, 1)
        assert waiter.wait() is False
        idle_wait.wake()  # as the update_status hook does
        assert waiter.wait() is True and idle_wait.current() is None
    finally:
        os.close(r)
        os.close(w)
    args = ServerArgs(model_path="m")
    configure_server_args(args, PddConfig(idle_wait_ms=5.0))
    assert args.idle_wait_ms == 5.0, args.idle_wait_ms
    print("0005: the idle wait is sglang's IdleWaiter, woken by the plugin's sockets and wake-ups")


def main() -> int:
    assert "/python/sglang/" in sglang.__file__, f"not the patched copy: {sglang.__file__}"
    check_capabilities()
    check_landing_extension()
    check_destinations_provider()
    check_decode_extension()
    check_idle_wait()
    print("PLUGIN CHECKS OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
