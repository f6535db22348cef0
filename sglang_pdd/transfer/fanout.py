"""The fan-out sender: one prefill request's KV to RelayDecode (all of it) and MainDecode (its miss).

P builds two stock senders on the same KV manager, one per bootstrap room: the relay's (room R, the
request's own) and the main's (room R2, from `custom_params.pdd.main_room`). Everything the manager
keeps per request is keyed by room, so the two transfers are independent: each receiver sends its
own `decode_prefix_len`, has its own status, and a main abort or death fails only R2.
`FanoutSender` stands where sglang expects the request's one sender (`req.disagg_kv_sender`):

* the scheduler sees the relay: its bootstrap, its prefix, its failures. P never waits for the
  main's handshake before sending to the relay;
* every chunk goes to the relay at once and is logged (page offset, page indices, state indices);
* once the main has bootstrapped (and the relay was initialised) the main leg is activated: skip the
  pages the main already caches (`(main_prefix - relay_prefix) / page_size`), take a second
  metadata slot whose row is a copy of the relay's with room R2 (the main decode checks the room),
  and replay the logged chunks trimmed to the main's pages; later chunks follow the same way;
* `poll()` reports Success (or the relay's Failed) only when the main leg is over too: succeeded,
  failed or aborted with no chunk still being written from P's pages, or never bootstrapped within
  `main_bootstrap_timeout`. Until then it says Transferring, which keeps P's KV and metadata row.

The main leg never fails the request. Plain Python (no sglang import): the KV manager and the
metadata slots come in through the small `RoomTable` and `MetadataSlots` interfaces, so the logic is
unit-tested with fakes (tests/fakes/fanout.py); the sglang adapters are in
sglang_pdd.transfer.mooncake_fanout.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

logger = logging.getLogger(__name__)


class Poll(enum.IntEnum):
    """sglang's `KVPoll` values (plain ints there; tests/unit/transfer/test_fanout_sender.py pins the equality)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


TERMINAL = (Poll.Failed, Poll.Success)


class ChildSender(Protocol):
    """The part of sglang's `CommonKVSender` the fan-out drives."""

    bootstrap_room: int

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None: ...

    def send(self, kv_indices: Any, state_indices: list | None = None, num_kv_tokens: int | None = None,
             **kw: Any) -> None: ...

    def poll(self) -> int: ...

    def pop_decode_prefix_len(self) -> int: ...

    def clear(self) -> None: ...

    def abort(self) -> None: ...

    def failure_exception(self) -> None: ...


class MetadataSlots(Protocol):
    """P's metadata rows (the first token etc. that travels with the last chunk)."""

    def alloc(self) -> int | None: ...

    def free(self, index: int) -> None: ...

    def copy_row(self, src: int, dst: int, room: int) -> None:
        """Make row `dst` a copy of row `src` that names bootstrap room `room`."""


class RoomTable(Protocol):
    """What the fan-out needs of the KV manager's per-room state."""

    def outstanding(self, room: int) -> int:
        """Chunks of `room` a transfer worker has dequeued and not finished (they read P's pages)."""

    def fail(self, room: int, reason: str) -> None:
        """Mark `room` failed and tell its receiver, if it registered."""

    def release(self, room: int) -> None:
        """Drop what the manager still keeps for a concluded main room (failure record, routing); if
        the fan-out gave the main up (`fail`) and it registered since, tell it the room failed."""


class MainState(enum.Enum):
    WAITING = "waiting"  # main has not bootstrapped yet (or the relay is not initialised)
    ACTIVE = "active"  # main initialised, chunks being replayed / forwarded
    DRAINING = "draining"  # main failed; waiting until no chunk of it is in flight
    DONE = "done"


@dataclass(frozen=True)
class FanoutContext:
    slots: MetadataSlots
    rooms: RoomTable
    page_size: int
    main_bootstrap_timeout: float
    clock: Callable[[], float] = time.monotonic
    extra_skip_pages: int = 0  # withhold pages the main needs: a negative control (transfer/controls.py)


@dataclass
class _Chunk:
    start: int  # offset, in relay pages, of the chunk's first page
    pages: Any  # page indices (numpy array, or a host tensor with its `indices_event`)
    state_indices: list | None
    num_kv_tokens: int | None
    is_last: bool
    extra: dict = field(default_factory=dict)  # indices_event / wait_event, passed on as is


class FanoutSender:
    def __init__(self, relay: ChildSender, main: ChildSender, ctx: FanoutContext):
        self.relay = relay
        self.main = main
        self.ctx = ctx
        self.main_room = main.bootstrap_room
        self.main_state = MainState.WAITING
        self.main_outcome: str | None = None  # "success" or why the main leg ended without it
        self._created = ctx.clock()
        self._num_pages: int | None = None
        self._aux_index: int | None = None
        self._relay_prefix = 0
        self._relay_sent = 0
        self._log: list[_Chunk] = []
        self._replayed = 0
        self._skip = 0
        self._main_total = 0
        self._main_sent = 0
        self._main_aux: int | None = None
        self._main_released = False

    # ---- the BaseKVSender surface sglang's prefill scheduler uses --------------------------------

    @property
    def bootstrap_room(self) -> int:
        return self.relay.bootstrap_room

    @property
    def _early_send_wait_event(self):  # set by the scheduler before an early cached-prefix send
        return getattr(self.relay, "_early_send_wait_event", None)

    @_early_send_wait_event.setter
    def _early_send_wait_event(self, event) -> None:
        self.relay._early_send_wait_event = event

    def __getattr__(self, name: str):
        # kv_mgr, get_transfer_metric, mark_prefill_complete, should_send_kv_chunk, ...: the relay's
        if name in ("relay", "main", "ctx"):
            raise AttributeError(name)
        return getattr(self.relay, name)

    def pop_decode_prefix_len(self) -> int:
        self._relay_prefix = self.relay.pop_decode_prefix_len()
        return self._relay_prefix

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        self.relay.init(num_kv_indices, aux_index)
        self._num_pages = num_kv_indices
        self._aux_index = aux_index
        self._progress_main()

    def send(self, kv_indices: Any, state_indices: list | None = None, num_kv_tokens: int | None = None,
             **kw: Any) -> None:
        wait_event = self._early_send_wait_event  # consumed by the relay's send; the main needs it too
        self.relay.send(kv_indices, state_indices, num_kv_tokens=num_kv_tokens, **kw)
        extra = dict(kw)
        if wait_event is not None:
            extra["wait_event"] = wait_event
        start = self._relay_sent
        self._relay_sent += len(kv_indices)
        self._log.append(_Chunk(start, kv_indices, state_indices, num_kv_tokens,
                                is_last=self._num_pages is not None and self._relay_sent == self._num_pages,
                                extra=extra))
        self._progress_main()

    def poll(self) -> int:
        self._progress_main()
        status = self.relay.poll()
        if status == Poll.Failed and self.main_state in (MainState.WAITING, MainState.ACTIVE):
            self._fail_main("relay failed")
        if status in TERMINAL and not self._main_over():
            return Poll.Transferring
        return status

    def clear(self) -> None:
        self.relay.clear()
        self._release_main()

    def abort(self) -> None:
        self.relay.abort()
        if self.main_state in (MainState.WAITING, MainState.ACTIVE):
            self._fail_main("request aborted on prefill")
        # Some abort paths release P's KV without polling again: free the main's slot and records now
        # (a chunk already being written still finishes; poll() keeps waiting for it when it is polled).
        self._release_main()

    def failure_exception(self) -> None:
        if self.main_state in (MainState.WAITING, MainState.ACTIVE):
            self._fail_main("relay failed")
        self._release_main()
        self.relay.failure_exception()

    # ---- the main leg ------------------------------------------------------------------------------

    def _main_over(self) -> bool:
        return self.main_state is MainState.DONE and self.ctx.rooms.outstanding(self.main_room) == 0

    def _progress_main(self) -> None:
        if self.main_state is MainState.DONE:
            return
        if self.main_state is MainState.DRAINING:
            if self.ctx.rooms.outstanding(self.main_room) == 0:
                self.main_state = MainState.DONE
            return
        status = self.main.poll()
        if status == Poll.Failed:
            self._end_main("main transfer failed (aborted by the main decode, or a write to it failed)")
            return
        if self.main_state is MainState.WAITING:
            if status == Poll.Bootstrapping:
                if self.ctx.clock() - self._created >= self.ctx.main_bootstrap_timeout:
                    self._fail_main(f"main did not bootstrap within {self.ctx.main_bootstrap_timeout:g}s")
                return
            if status == Poll.WaitingForInput and self._num_pages is not None:
                self._activate()
            if self.main_state is not MainState.ACTIVE:
                return
        self._replay()
        if self.main_state is MainState.ACTIVE and self.main.poll() == Poll.Success:
            self.main_outcome = "success"
            self.main_state = MainState.DONE
            logger.debug("fanout room %s: main room %s done", self.bootstrap_room, self.main_room)

    def _activate(self) -> None:
        main_prefix = self.main.pop_decode_prefix_len()
        diff = main_prefix - self._relay_prefix
        if diff < 0 or diff % self.ctx.page_size or diff // self.ctx.page_size > self._num_pages:
            self._fail_main(f"main prefix {main_prefix} does not extend the relay's {self._relay_prefix} "
                            f"on a page boundary within the prompt (page size {self.ctx.page_size})")
            return
        aux = self.ctx.slots.alloc()
        if aux is None:
            self._fail_main("no free metadata slot for the main leg")
            return
        self._main_aux = aux
        self._skip = min(diff // self.ctx.page_size + self.ctx.extra_skip_pages, self._num_pages)
        self._main_total = self._num_pages - self._skip
        self.main.init(self._main_total, aux)
        self.main_state = MainState.ACTIVE
        logger.debug("fanout room %s: main room %s active, prefix %d, skips %d of %d pages",
                     self.bootstrap_room, self.main_room, main_prefix, self._skip, self._num_pages)

    def _replay(self) -> None:
        """Forward logged chunks to the main, trimmed to the pages past its prefix.

        `CommonKVSender` marks a send last by position (its page count reaching the total given to
        `init`) and ships the metadata row with it. The main's pages are the relay's last
        `main_total` pages, in the same order and chunking, so the main reaches its total on exactly
        the chunk where the relay reaches its own: the relay's last one (empty when the main caches
        every page: then it carries the metadata row only).
        """
        while self.main_state is MainState.ACTIVE and self._replayed < len(self._log):
            chunk = self._log[self._replayed]
            self._replayed += 1
            cut = max(0, self._skip - chunk.start)
            pages = chunk.pages[cut:]
            if len(pages) == 0 and not chunk.is_last:
                continue
            tokens = chunk.num_kv_tokens
            if tokens is not None:
                tokens = max(0, tokens - cut * self.ctx.page_size)
            if chunk.is_last:
                self.ctx.slots.copy_row(self._aux_index, self._main_aux, self.main_room)
            self._send_main(_Chunk(chunk.start + cut, pages, chunk.state_indices, tokens, chunk.is_last,
                                   chunk.extra))

    def _send_main(self, chunk: _Chunk) -> None:
        extra = dict(chunk.extra)
        wait_event = extra.pop("wait_event", None)
        if wait_event is not None:
            self.main._early_send_wait_event = wait_event
        self._main_sent += len(chunk.pages)
        self.main.send(chunk.pages, chunk.state_indices if chunk.is_last else None,
                       num_kv_tokens=chunk.num_kv_tokens, **extra)

    def _fail_main(self, reason: str) -> None:
        logger.info("fanout room %s: main room %s given up: %s", self.bootstrap_room, self.main_room, reason)
        self.main.abort()  # marks R2 failed locally: the workers skip its queued chunks
        self.ctx.rooms.fail(self.main_room, reason)
        self._end_main(reason)

    def _end_main(self, outcome: str) -> None:
        if self.main_outcome is None:
            self.main_outcome = outcome
        self.main_state = MainState.DRAINING
        if self.ctx.rooms.outstanding(self.main_room) == 0:
            self.main_state = MainState.DONE
        logger.debug("fanout room %s: main room %s ended: %s", self.bootstrap_room, self.main_room, outcome)

    def _release_main(self) -> None:
        if self._main_released:
            return
        self._main_released = True
        self.ctx.rooms.release(self.main_room)  # first: it may still tell a late main, by its registration
        self.main.clear()
        if self._main_aux is not None:
            self.ctx.slots.free(self._main_aux)
            self._main_aux = None
        self._log.clear()

