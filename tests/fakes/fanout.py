"""The fan-out sender's collaborators (sglang_pdd.transfer.fanout), no sglang: child senders, metadata
slots, rooms.

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
