"""Main lanes: MainDecode's chunks go to their own transfer queue and worker thread, per main session.

Mooncake's prefill KV manager shards chunks onto a few queues by the sum of the receivers' session
ports (`add_transfer_request`), and one worker thread per queue writes them one after the other. A
relay room and a main room can land on the same queue; a main write over the slow WAN would then
hold back the relay's chunks behind it (and any other room of that shard). So every chunk of a main
room goes to a lane of its own, one per main receiver session set: a queue served by the stock
`transfer_worker` on a dedicated thread, which runs with the accounting path "main". Relay rooms
stay on the stock queues; their receiver sessions are reported once (`on_relay_sessions`) so the
byte accounting can label them "relay".

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


class _Lane:
    def __init__(self, name: str, worker: Callable[[Any, ThreadPoolExecutor], None],
                 thread_context: Callable[[], ContextManager]):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
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
                 on_relay_sessions: Callable[[Iterable[str]], None] | None = None):
        self.registry = registry
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
                lane = _Lane(name, lambda q, ex: manager.transfer_worker(q, ex, None, 0), self._thread_context)
                self._lanes[key] = lane
                logger.info("main lane %s for sessions %s", name, ", ".join(sessions))
            return lane

    def _note_relay_sessions(self, sessions: Iterable[str]) -> None:
        new = [s for s in sessions if s not in self._relay_sessions_seen]
        if new and self._on_relay_sessions is not None:
            self._relay_sessions_seen.update(new)
            self._on_relay_sessions(new)
