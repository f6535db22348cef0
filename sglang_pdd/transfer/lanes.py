"""Main lanes: MainDecode's chunks go to their own transfer queue and worker thread, per main session.

Mooncake's prefill KV manager shards chunks onto a few queues by the sum of the receivers' session
ports (`add_transfer_request`), and one worker thread per queue writes them one after the other. A
relay room and a main room can land on the same queue; a main write over the slow WAN would then
hold back the relay's chunks behind it (and any other room of that shard). So every chunk of a main
room goes to a lane of its own, one per main receiver session set: a queue served by the stock
`transfer_worker` on a dedicated thread, which runs with the accounting path "main". Relay rooms
stay on the stock queues; their receiver sessions are reported once (`on_relay_sessions`) so the
byte accounting can label them "relay".

Each lane counts the KV bytes it holds (`CountingQueue`: chunks put and not yet written) and
reports them per destination (`on_queued(peer, nbytes)`, the gauge `sglang_pdd_lane_queued_bytes`):
the router's queue-aware WAN prediction reads them (`policy.wan_queue`).

`FanoutRegistry` says which rooms are fan-out legs; the fan-out hook opens a pair, the sender
closes it when its main leg is released.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ContextManager, Iterable

logger = logging.getLogger(__name__)

MAIN_PATH = "main"
RELAY_PATH = "relay"


class FanoutRegistry:
    """Rooms that are the two legs of a fan-out: main room -> relay room; and the rooms this prefill
    refuses registrations for: main rooms closed lately (a main decode registering for one of those
    is late) and rooms of rejected requests (see mooncake_fanout.refuse_room)."""

    def __init__(self, remember_closed: int = 65536) -> None:
        self._lock = threading.Lock()
        self._relay_of: dict[int, int] = {}
        self._relay_rooms: dict[int, int] = {}  # relay room -> main room
        self._refused: OrderedDict[int, None] = OrderedDict()
        self._remember = remember_closed

    def open(self, relay_room: int, main_room: int) -> None:
        with self._lock:
            self._relay_of[main_room] = relay_room
            self._relay_rooms[relay_room] = main_room
            self._refused.pop(main_room, None)

    def close(self, main_room: int) -> None:
        with self._lock:
            relay_room = self._relay_of.pop(main_room, None)
            if relay_room is not None and self._relay_rooms.get(relay_room) == main_room:
                del self._relay_rooms[relay_room]
        self.refuse(main_room)

    def refuse(self, room: int) -> None:
        """Refuse later registrations for `room` (the last `remember_closed` such rooms are kept)."""
        with self._lock:
            self._refused[room] = None
            while len(self._refused) > self._remember:
                self._refused.popitem(last=False)

    def refuses(self, room: int) -> bool:
        return room in self._refused

    def is_main(self, room: int) -> bool:
        return room in self._relay_of

    def is_relay(self, room: int) -> bool:
        return room in self._relay_rooms

    def __len__(self) -> int:
        return len(self._relay_of)


def chunk_bytes(manager: Any, chunk: Any) -> int:
    """KV bytes of one transfer chunk: its pages times the bytes of a page over every KV buffer."""
    pages = getattr(chunk, "prefill_kv_indices", None)
    return len(pages) * sum(manager.kv_args.kv_item_lens) if pages is not None else 0


class CountingQueue:
    """A lane's queue that knows the bytes it holds: a chunk counts from its `put` until the worker
    asks for the next one (the worker writes one chunk at a time, so the chunk it took is written
    then). A chunk put back while it is being written (a deferred one) counts once."""

    def __init__(self, nbytes: Callable[[Any], int], on_change: Callable[[int], None] = lambda n: None):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._nbytes, self._on_change = nbytes, on_change
        self._lock = threading.Lock()
        self._held: dict[int, tuple[Any, int]] = {}  # id(chunk) -> (chunk, bytes), put and not yet written
        self._current: Any = None
        self._requeued = False
        self.queued_bytes = 0

    def put(self, item: Any) -> None:
        if item is not None:
            with self._lock:
                if id(item) in self._held:
                    self._requeued = self._requeued or item is self._current
                else:
                    n = self._nbytes(item)
                    self._held[id(item)] = (item, n)
                    self.queued_bytes += n
                n = self.queued_bytes
            self._on_change(n)
        self._q.put(item)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self._written()
        item = self._q.get(*args, **kwargs)
        with self._lock:
            self._current, self._requeued = item, False
        return item

    def _written(self) -> None:
        with self._lock:
            cur, self._current = self._current, None
            if cur is None or self._requeued or id(cur) not in self._held:
                return
            self.queued_bytes -= self._held.pop(id(cur))[1]
            n = self.queued_bytes
        self._on_change(n)


class _Lane:
    def __init__(self, name: str, worker: Callable[[Any, ThreadPoolExecutor], None],
                 thread_context: Callable[[], ContextManager], lane_queue: CountingQueue):
        self.queue = lane_queue
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=name)

        def run() -> None:
            with thread_context():
                worker(self.queue, self.executor)

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()


class _LaneView:
    """The KV manager as `add_transfer_request` sees it, with one lane as its only transfer queue."""

    def __init__(self, manager: Any, lane_queue: Any):
        object.__setattr__(self, "_manager", manager)
        object.__setattr__(self, "transfer_queues", [lane_queue])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


class MainLanes:
    def __init__(self, registry: FanoutRegistry,
                 thread_context: Callable[[], ContextManager] = contextlib.nullcontext,
                 on_relay_sessions: Callable[[Iterable[str]], None] | None = None,
                 on_queued: Callable[[str, int], None] | None = None):
        """`on_queued(peer, nbytes)`: a lane's queued KV bytes changed (peer: its first receiver session)."""
        self.registry = registry
        self._on_queued = on_queued
        self._thread_context = thread_context
        self._on_relay_sessions = on_relay_sessions
        self._lock = threading.Lock()
        self._lanes: dict[tuple[int, tuple[str, ...]], _Lane] = {}
        self._relay_sessions_seen: set[str] = set()

    def route(self, original: Callable, manager: Any, room: int, *args: Any, **kwargs: Any) -> Any:
        """`MooncakeKVManager.add_transfer_request(room, ...)`, with main rooms sent down their lane."""
        infos = getattr(manager, "transfer_infos", {}).get(room)
        if infos and self.registry.is_relay(room):
            self._note_relay_sessions(infos.keys())
        if not infos or not self.registry.is_main(room):
            return original(manager, room, *args, **kwargs)
        lane = self._lane(manager, tuple(sorted(infos.keys())))
        logger.debug("main room %s: chunk to lane %s", room, lane.thread.name)
        return original(_LaneView(manager, lane.queue), room, *args, **kwargs)

    def lane_count(self) -> int:
        return len(self._lanes)

    def _lane(self, manager: Any, sessions: tuple[str, ...]) -> _Lane:
        key = (id(manager), sessions)
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                name = f"pdd-main-lane-{len(self._lanes)}"
                report = self._on_queued
                counting = CountingQueue(lambda chunk: chunk_bytes(manager, chunk),
                                         (lambda n: report(sessions[0], n)) if report is not None else (lambda n: None))
                lane = _Lane(name, lambda q, ex: manager.transfer_worker(q, ex, None, 0), self._thread_context,
                             counting)
                self._lanes[key] = lane
                logger.info("main lane %s for sessions %s", name, ", ".join(sessions))
            return lane

    def _note_relay_sessions(self, sessions: Iterable[str]) -> None:
        new = [s for s in sessions if s not in self._relay_sessions_seen]
        if new and self._on_relay_sessions is not None:
            self._relay_sessions_seen.update(new)
            self._on_relay_sessions(new)
