"""Building a `FanoutSender` on sglang's prefill bootstrap queue (Mooncake backend).

`FanoutBuilder.attach(queue, req)` runs right after sglang's `PrefillBootstrapQueue.create_sender`
built the request's sender (the relay's, room R): when the request carries
`custom_params.pdd.main_room` (R2) it builds a second sender of the same class on the same KV manager
and bootstrap server for R2, and puts a `FanoutSender` over both in `req.disagg_kv_sender`.
`FanoutBuilder.main_room(req)` runs before it and turns a malformed `pdd` parameter into a clear error
for that request. On sglang with patch 0002, `FanoutBuilder.destinations(req, main_room)` gives
sglang's KV destinations provider MD's room instead, and sglang builds the senders.

The adapters the plain fan-out logic needs live here too: `MooncakeRooms` (the manager's per-room
state) and `MetadataRows` (P's metadata slots, and the copy of a row that names the main's room).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_pdd.protocol import request as request_params
from sglang_pdd.protocol.request_auth import ParamsVerifier
from sglang_pdd.transfer.fanout import FanoutContext, FanoutSender, Poll
from sglang_pdd.transfer.lanes import FanoutRegistry

logger = logging.getLogger(__name__)

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang's warm-up / health-check marker: no real transfer


class FanoutParamsError(ValueError):
    """The request's `custom_params.pdd` cannot drive a fan-out."""


class MooncakeRooms:
    """`RoomTable` over a Mooncake (CommonKVManager) prefill KV manager, for one main room."""

    def __init__(self, kv_mgr: Any, registry: FanoutRegistry):
        self.kv_mgr = kv_mgr
        self.registry = registry
        self._told_on_fail: set | None = None  # receivers told when the main leg was given up

    def outstanding(self, room: int) -> int:
        return int(self.kv_mgr._staging_outstanding.get(room, 0))

    def fail(self, room: int, reason: str) -> None:
        self._told_on_fail = set(self.kv_mgr._room_notify_targets(room))
        self.kv_mgr.conclude_failure(bootstrap_room=room, failure_reason=reason)

    def release(self, room: int) -> None:
        if self._told_on_fail is not None:
            # Given up (e.g. bootstrap timeout) and registered since: nothing will be sent, say so.
            late = [t for t in self.kv_mgr._room_notify_targets(room) if t not in self._told_on_fail]
            if late:
                self.kv_mgr.send_kv_status_message(targets=late, bootstrap_room=room, status=Poll.Failed,
                                                   failure_reason=LATE_MAIN_REASON)
        with self.kv_mgr.failure_lock:
            self.kv_mgr.failure_records.pop(room, None)
        self.registry.close(room)


LATE_MAIN_REASON = "the prefill gave this main room up before the main decode registered (bootstrap timeout)"
REFUSED_REASON = "the prefill will not send this room (its fan-out is over, or the request was rejected)"


def refuse_room(kv_mgr: Any, room: int, reason: str) -> None:
    """A decode registered for a room this prefill will never send (a main room whose fan-out is
    over, a rejected request): tell it the room failed and forget its registration, instead of
    keeping the room in the manager's tables while the decode waits for KV until its own timeout."""
    targets = kv_mgr._room_notify_targets(room)
    kv_mgr.transfer_infos.pop(room, None)
    kv_mgr.req_to_decode_prefix_len.pop(room, None)
    kv_mgr.request_status.pop(room, None)
    if targets:
        kv_mgr.send_kv_status_message(targets=targets, bootstrap_room=room, status=Poll.Failed,
                                      failure_reason=reason)
        logger.info("room %s: refused the decode's registration: %s", room, reason)


class MetadataRows:
    """`MetadataSlots` over sglang's `ReqToMetadataIdxAllocator` and `MetadataBuffers`."""

    def __init__(self, allocator: Any, buffers: Any):
        self.allocator = allocator
        self.buffers = buffers

    def alloc(self) -> int | None:
        return self.allocator.alloc()

    def free(self, index: int) -> None:
        self.allocator.free(index)

    def copy_row(self, src: int, dst: int, room: int) -> None:
        import torch

        rows = self.buffers.bootstrap_room.shape[0]
        for tensor in vars(self.buffers).values():
            if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and tensor.shape[0] == rows:
                tensor[dst].copy_(tensor[src])
        self.buffers.bootstrap_room[dst, 0] = room  # the main decode checks the row names its room
        if getattr(self.buffers, "kv_checksum", None) is not None:
            self.buffers.kv_checksum[dst] = 0  # the digest covers the relay's pages: "not written"


class FanoutBuilder:
    """`extra_skip_pages`: pages each fan-out withholds from MD beyond its hit, read per request (0; the
    tests' control gives its knob, transfer/controls.py)."""

    def __init__(self, registry: FanoutRegistry, main_bootstrap_timeout: float,
                 verifier: ParamsVerifier | None = None, extra_skip_pages: Callable[[], int] = lambda: 0):
        self.registry = registry
        self.main_bootstrap_timeout = main_bootstrap_timeout
        self.extra_skip_pages = extra_skip_pages
        self.verifier = verifier  # with the secret: only the router's signed main_room is taken

    def main_room(self, req: Any) -> int | None:
        """MD's room for this request, None for a plain PD request; FanoutParamsError when malformed
        or, on a prefill holding the secret, not signed by the router for this request's room."""
        params = self.main_params(req)
        if params is None:
            return None
        if self.verifier is not None:
            try:
                self.verifier.check(params, req.bootstrap_room)
            except request_params.RequestParamsError as e:
                raise FanoutParamsError(str(e)) from None
        return params.main_room

    @staticmethod
    def main_params(req: Any) -> request_params.RequestParams | None:
        """The request's PDD parameters when they name a main room (checked, not yet verified)."""
        try:
            params = request_params.parse(req.sampling_params.custom_params)
        except request_params.RequestParamsError as e:
            raise FanoutParamsError(str(e)) from None
        if params is None or params.main_room is None:
            return None
        if req.bootstrap_room is None:
            raise FanoutParamsError("custom_params.pdd.main_room needs the request's bootstrap_room (the relay's)")
        if params.main_room == req.bootstrap_room:
            raise FanoutParamsError(f"custom_params.pdd.main_room must differ from bootstrap_room "
                                    f"({req.bootstrap_room}): the main decode needs a room of its own")
        return params

    def check_room_free(self, main_room: int, rooms_in_flight) -> None:
        """FanoutParamsError unless `main_room` is no room this prefill already serves: a leg of an
        open fan-out, a room it refuses, or the bootstrap room of a request in its queues (a client
        naming another request's room would have P send that request's room a second prompt's KV)."""
        r = self.registry
        if r.is_main(main_room) or r.is_relay(main_room) or r.refuses(main_room) or main_room in rooms_in_flight:
            raise FanoutParamsError(f"custom_params.pdd.main_room {main_room} is a room this prefill already "
                                    "serves or refused")

    def destinations(self, req: Any, main_room: int) -> list:
        """MD's room as sglang's `KVDestination` (patch 0002); the registry closes it on release."""
        from sglang.srt.disaggregation.common.multi_destination import KVDestination

        if self.extra_skip_pages():
            logger.warning("main_extra_skip_pages is a knob of the hooked fan-out; sglang's sender ignores it")
        self.registry.open(req.bootstrap_room, main_room)
        logger.debug("fanout room %s: main room %s", req.bootstrap_room, main_room)
        return [KVDestination(main_room, self.main_bootstrap_timeout,
                              on_release=lambda _status: self.registry.close(main_room))]

    def attach(self, queue: Any, req: Any, main_room: int) -> FanoutSender | None:
        """Wrap the relay sender sglang just built; None when this request cannot fan out."""
        relay = req.disagg_kv_sender
        if req.bootstrap_host == FAKE_BOOTSTRAP_HOST or not hasattr(relay, "bootstrap_server_url"):
            return None
        main = type(relay)(
            mgr=queue.kv_manager,
            bootstrap_addr=relay.bootstrap_server_url,
            bootstrap_room=main_room,
            req_has_disagg_prefill_dp_rank=req.disagg_prefill_dp_rank is not None,
        )
        self.registry.open(req.bootstrap_room, main_room)
        ctx = FanoutContext(
            slots=MetadataRows(queue.req_to_metadata_buffer_idx_allocator, queue.metadata_buffers),
            rooms=MooncakeRooms(queue.kv_manager, self.registry),
            page_size=queue.scheduler.token_to_kv_pool_allocator.page_size,
            main_bootstrap_timeout=self.main_bootstrap_timeout,
            extra_skip_pages=self.extra_skip_pages(),
        )
        sender = FanoutSender(relay, main, ctx)
        req.disagg_kv_sender = sender
        logger.debug("fanout room %s: main room %s", req.bootstrap_room, main_room)
        return sender
