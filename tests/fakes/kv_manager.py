"""Mooncake's KV manager (sglang's `MooncakeKVManager`) and its transfer engine, reduced to what the plugin
touches: rooms, registrations and status messages (`MooncakeRooms`, `refuse_room`), and, given a pool,
its KV buffers registered with an engine whose `_transfer_data` copies bytes between registered host
memory (the packed WAN path, end to end in one process).
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

from sglang_pdd.transfer.fanout import Poll
from sglang_pdd.transfer.kv_pool_view import attach


class FakeTransferEngine:
    """Mooncake's transfer engine: the memory registered with it (`holds`), and every call."""

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
    """A prefill or decode KV manager. `pool` (a tests.fakes.kv_pool pool): its buffers are the manager's
    `kv_args.kv_data_ptrs` and it gets its pool view (`attach`), as when sglang builds it with the plugin
    loaded. `peer`: the other side's manager, whose engine must hold every destination written."""

    def __init__(self, pool=None, attn_tp_size: int = 1, pp_size: int = 1):
        self.transfer_infos: dict[int, dict[str, object]] = {}
        self.req_to_decode_prefix_len: dict[int, int] = {}
        self.request_status: dict[int, int] = {}
        self.failure_records: dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self._staging_outstanding: dict[int, int] = {}
        self.concluded: list[tuple[int, str]] = []
        self.status_messages: list[tuple[list, int, int]] = []
        self.attn_tp_size, self.pp_size = attn_tp_size, pp_size
        self.engine = FakeTransferEngine()
        self.peer: FakeKVManager | None = None
        self.batches: list[list[tuple[int, int, int]]] = []  # what _transfer_data was asked to write
        self.fail_from: int | None = None  # batches from this index on fail (-1)
        self.pool = pool
        self.kv_args = SimpleNamespace(kv_data_ptrs=[t.data_ptr() for t in pool.buffers()] if pool is not None else [])
        if pool is not None:
            attach(self, pool)

    # -- rooms: a decode side registering, failures concluded and told -------------------------------------------

    def register(self, room: int, session: str, endpoint: str, port: int, prefix: int = 0) -> None:
        self.transfer_infos.setdefault(room, {})[session] = SimpleNamespace(endpoint=endpoint, dst_port=port,
                                                                            is_dummy=False)
        self.req_to_decode_prefix_len[room] = prefix

    def _room_notify_targets(self, room: int) -> list:
        return [(i.endpoint, i.dst_port) for i in self.transfer_infos.get(room, {}).values() if not i.is_dummy]

    def conclude_failure(self, *, bootstrap_room: int, failure_reason: str) -> None:
        self.concluded.append((bootstrap_room, failure_reason))
        self.failure_records.setdefault(bootstrap_room, failure_reason)
        self.send_kv_status_message(targets=self._room_notify_targets(bootstrap_room), bootstrap_room=bootstrap_room,
                                    status=Poll.Failed)

    def send_kv_status_message(self, *, targets, bootstrap_room, status, failure_reason=None) -> None:
        if targets:
            self.status_messages.append((list(targets), bootstrap_room, int(status)))

    # -- the transfer: a batch of (src, dst, length) writes into the peer's registered memory --------------------

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
