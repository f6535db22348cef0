"""Fakes for the fan-out sender's collaborators (no sglang): child senders, metadata slots, rooms.

`FakeChildSender` keeps `CommonKVSender`'s contract where it matters: a send is last when the page
count reaches the total given to `init` (by position), and only then carries the aux (metadata) index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pdd.transfer.fanout import Poll


class FakeTransferError(Exception):
    pass


@dataclass
class Sent:
    pages: list[int]
    state_indices: object
    num_kv_tokens: int | None
    is_last: bool
    aux: int | None
    extra: dict


class FakeChildSender:
    def __init__(self, room: int, prefix: int = 0):
        self.bootstrap_room = room
        self.prefix = prefix
        self.status = Poll.Bootstrapping
        self.total: int | None = None
        self.aux_index: int | None = None
        self.sent: list[Sent] = []
        self.sent_pages = 0
        self.cleared = False
        self.aborted = False
        self.prefix_popped = False
        self._early_send_wait_event = None
        self.waits_seen: list[object] = []

    # the peer bootstraps / the transfer worker reports
    def bootstrap(self) -> None:
        self.status = Poll.WaitingForInput

    def pop_decode_prefix_len(self) -> int:
        self.prefix_popped = True
        return self.prefix

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        assert self.status == Poll.WaitingForInput or self.status == Poll.Transferring, self.status
        self.total, self.aux_index = num_kv_indices, aux_index
        self.status = Poll.Transferring

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None, **kw) -> None:
        assert self.total is not None, "send before init"
        self.waits_seen.append(self._early_send_wait_event)
        self._early_send_wait_event = None
        if self.status == Poll.Failed:
            return
        self.sent_pages += len(kv_indices)
        assert self.sent_pages <= self.total, "sent past the total"
        last = self.sent_pages == self.total
        self.sent.append(Sent(list(kv_indices), state_indices, num_kv_tokens, last,
                              self.aux_index if last else None, kw))

    def poll(self) -> int:
        return self.status

    def clear(self) -> None:
        self.cleared = True

    def abort(self) -> None:
        self.aborted = True
        self.status = Poll.Failed

    def failure_exception(self) -> None:
        self.clear()
        raise FakeTransferError(f"room {self.bootstrap_room} failed")

    # test helpers
    def pages(self) -> list[int]:
        return [p for s in self.sent for p in s.pages]

    def lasts(self) -> list[bool]:
        return [s.is_last for s in self.sent]


@dataclass
class FakeSlots:
    free_slots: list[int] = field(default_factory=lambda: [10, 11, 12])
    copies: list[tuple[int, int, int]] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)

    def alloc(self) -> int | None:
        return self.free_slots.pop(0) if self.free_slots else None

    def free(self, index: int) -> None:
        assert index not in self.free_slots, f"double free of slot {index}"
        self.freed.append(index)
        self.free_slots.append(index)

    def copy_row(self, src: int, dst: int, room: int) -> None:
        self.copies.append((src, dst, room))


@dataclass
class FakeRooms:
    in_flight: dict[int, int] = field(default_factory=dict)
    failed: list[tuple[int, str]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)

    def outstanding(self, room: int) -> int:
        return self.in_flight.get(room, 0)

    def fail(self, room: int, reason: str) -> None:
        self.failed.append((room, reason))

    def release(self, room: int) -> None:
        self.released.append(room)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeKVManager:
    """The parts of a Mooncake prefill KV manager that MooncakeRooms / refuse_room touch."""

    def __init__(self) -> None:
        import threading

        self.transfer_infos: dict[int, dict[str, object]] = {}
        self.req_to_decode_prefix_len: dict[int, int] = {}
        self.request_status: dict[int, int] = {}
        self.failure_records: dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self._staging_outstanding: dict[int, int] = {}
        self.concluded: list[tuple[int, str]] = []
        self.status_messages: list[tuple[list, int, int]] = []

    def register(self, room: int, session: str, endpoint: str, port: int, prefix: int = 0) -> None:
        from types import SimpleNamespace

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


# -- MainDecode's attention hook (sglang_pdd.decode.main.handoff_attention): a layer, a pool, a forward batch ----

class FakeMode:
    def __init__(self, name: str = "EXTEND"):
        self.name = name


class MHATokenToKVPool:
    """Stands for sglang's plain MHA token pool (the hook checks the class by name): [S, H, D] per layer."""

    def __init__(self, slots: int, heads: int, dim: int, layers: int, dtype=None, page_size: int = 1):
        import torch

        dtype = dtype or torch.float32
        self.dtype = self.store_dtype = dtype
        self.head_num, self.head_dim, self.v_head_dim, self.page_size = heads, dim, dim, page_size
        self.use_hnd = False
        self.k_buffer = [torch.zeros(slots, heads, dim, dtype=dtype) for _ in range(layers)]
        self.v_buffer = [torch.zeros(slots, heads, dim, dtype=dtype) for _ in range(layers)]
        self.writes: list[tuple[int, list[int]]] = []

    def get_key_buffer(self, layer_id: int):
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int):
        return self.v_buffer[layer_id]

    def set_kv_buffer(self, layer, loc, k, v, *a, **kw):
        loc = getattr(loc, "loc", loc)  # sglang's KVWriteLoc or bare slots
        self.k_buffer[layer.layer_id][loc.long()] = k.view(k.shape[0], self.head_num, self.head_dim)
        self.v_buffer[layer.layer_id][loc.long()] = v.view(v.shape[0], self.head_num, self.v_head_dim)
        self.writes.append((layer.layer_id, loc.tolist()))


@dataclass
class FakeAttnLayer:
    layer_id: int = 0
    tp_q_head_num: int = 4
    tp_k_head_num: int = 2
    qk_head_dim: int = 8
    v_head_dim: int = 8
    scaling: float = 8 ** -0.5
    logit_cap: float = 0.0
    sliding_window_size: int = -1
    is_cross_attention: bool = False
    use_irope: bool = False
    xai_temperature_len: int = -1
    attn_type: object = field(default_factory=lambda: FakeMode("DECODER"))

    def __post_init__(self):
        self.attn_type.value = "decoder"


@dataclass
class FakeForwardBatch:
    batch_size: int
    extend_prefix_lens_cpu: list
    extend_seq_lens_cpu: list
    req_pool_indices: object = None
    out_cache_loc: object = None
    out_cache_loc_is_physical: bool = False
    forward_mode: FakeMode = field(default_factory=FakeMode)
    spec_info: object = None
    encoder_lens: object = None
    _attn_output: object = None

    def __post_init__(self):
        import torch

        self.extend_prefix_lens = torch.tensor(self.extend_prefix_lens_cpu, dtype=torch.int32)
        self.extend_seq_lens = torch.tensor(self.extend_seq_lens_cpu, dtype=torch.int32)


class FakeReqToTokenPool:
    def __init__(self, rows: int, width: int):
        import torch

        self.req_to_token = torch.zeros(rows, width, dtype=torch.int32)


class FakeAttnBackend:
    """An attention backend: the pools, and `forward` recording what reached sglang's own path."""

    def __init__(self, pool, req_to_token_pool):
        self.token_to_kv_pool, self.req_to_token_pool = pool, req_to_token_pool
        self.kv_index_translator = None
        self.calls: list[tuple] = []

    def original(self, backend, q, k, v, layer, fb, save_kv_cache=True, **kwargs):
        """Stands for the unhooked `AttentionBackend.forward` (returns a marker, writes nothing)."""
        self.calls.append((backend, q, k, v, layer, fb, save_kv_cache, kwargs))
        return ("sglang", layer.layer_id)
