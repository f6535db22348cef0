"""The router's side of MainDecode's KV events: where an MD publishes (`KvEventSource`), a ZMQ
subscriber on the router's loop that feeds one MD's `ExactCacheView` (`KvEventSubscriber`, ordering
and replay in `kv_events.KvEventFeed`), and a view per MD (`main_views`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sglang_pdd.router.cache import CacheView
from sglang_pdd.router.cache.exact_view import ExactCacheView
from sglang_pdd.router.cache.kv_events import END_SEQ, KvEventFeed, parse_seq
from sglang_pdd.router.cache.prefix_view import PrefixView

logger = logging.getLogger(__name__)


MAX_MESSAGE_BYTES = 64 << 20  # one KV event batch: far above sglang's, and a bound on what a peer can make us hold
RCVHWM = 1024  # batches queued in the router before ZMQ stops reading (the publisher's side then drops)


def _bounds(max_message_bytes: int) -> tuple:
    """A message over the size cap closes the connection (ZMQ does not reconnect after that protocol
    error: `_run` opens a new socket; the view goes stale and replays), and a slow router queues a
    bounded number of batches."""
    import zmq

    return ((zmq.MAXMSGSIZE, max_message_bytes), (zmq.RCVHWM, RCVHWM))


def _liveness() -> tuple:
    """ZMQ heartbeats and TCP keepalive on the subscription: an idle flow a middlebox dropped is noticed
    (the connection closes, the view goes stale, ZMQ reconnects) instead of looking connected forever."""
    import zmq  # zmq only once subscribed: the router imports this module without it

    return ((zmq.LINGER, 0), (zmq.HEARTBEAT_IVL, 10_000), (zmq.HEARTBEAT_TIMEOUT, 30_000),
            (zmq.HEARTBEAT_TTL, 30_000), (zmq.TCP_KEEPALIVE, 1), (zmq.TCP_KEEPALIVE_IDLE, 30),
            (zmq.TCP_KEEPALIVE_INTVL, 10), (zmq.TCP_KEEPALIVE_CNT, 3))


@dataclass(frozen=True)
class KvEventSource:
    """Where one MD publishes: its `--kv-events-config` endpoint and replay_endpoint, as seen from
    the router (`tcp://MD_HOST:PORT`), and its topic."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""

    def __post_init__(self):
        for e in (self.endpoint, self.replay_endpoint):
            if e is not None and not e.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"KV events endpoint {e!r}: expected tcp://HOST:PORT")
            if e is not None and "*" in e:
                raise ValueError(f"KV events endpoint {e!r}: give MD's address, not a bind wildcard")


class KvEventSubscriber:
    """Subscribes to one MD's publisher from the router's event loop and keeps its view current."""

    def __init__(self, source: KvEventSource, view: ExactCacheView, *, replay_timeout_s: float = 5.0,
                 context=None, max_message_bytes: int = MAX_MESSAGE_BYTES):
        import zmq.asyncio

        self.source, self.view, self.replay_timeout_s = source, view, replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.feed = KvEventFeed(view, can_replay=source.replay_endpoint is not None)
        self._ctx = context or zmq.asyncio.Context.instance()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kv-events {self.source.endpoint}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        # A new socket after each disconnect: ZMQ reconnects by itself after a reset or a heartbeat
        # timeout, but not after a protocol error (a message over MAXMSGSIZE), which would leave the
        # view stale for good.
        while True:
            await self._subscribe_once()
            await asyncio.sleep(0.1)

    async def _subscribe_once(self) -> None:
        """Read the publisher until its connection drops."""
        import zmq
        import zmq.asyncio

        sub = self._ctx.socket(zmq.SUB)
        for opt, value in _liveness() + _bounds(self.max_message_bytes):
            sub.setsockopt(opt, value)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.source.endpoint)
        logger.info("%s: subscribed to MD's KV events at %s (replay: %s)", self.view.name,
                    self.source.endpoint, self.source.replay_endpoint or "none")
        try:
            while True:
                if self.feed.resync_from is not None:
                    start = self.feed.resync_from
                    self.feed.on_replay(start, await self._replay(start))
                    continue
                try:
                    ready = dict(await poller.poll())
                    if sub in ready:
                        self.feed.on_message(await sub.recv_multipart())
                    if monitor in ready:
                        await monitor.recv_multipart()
                        logger.warning("%s: KV event publisher %s disconnected", self.view.name, self.source.endpoint)
                        self.feed.on_disconnect()
                        return
                except zmq.ZMQError as e:
                    logger.warning("%s: KV event socket: %s", self.view.name, e)
                    await asyncio.sleep(1.0)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Every buffered batch from `start`, or None when the replay endpoint does not answer."""
        import zmq

        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        for opt, value in _bounds(self.max_message_bytes):
            sock.setsockopt(opt, value)
        sock.connect(self.source.replay_endpoint)
        out: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                async with asyncio.timeout(self.replay_timeout_s):  # not wait_for (bpo-42130)
                    frames = await sock.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    self.feed.count_malformed("bad-replay", f"{len(frames)} frames")
                    continue
                if frames[2] == END_SEQ:
                    return out
                out.append((parse_seq(frames[2]), frames[3]))
        except TimeoutError:
            logger.warning("%s: no replay from %s within %.1f s", self.view.name,
                           self.source.replay_endpoint, self.replay_timeout_s)
            return None
        finally:
            sock.close(linger=0)


def main_views(urls: list[str], sources: dict[str, KvEventSource] | None = None
               ) -> tuple[dict[str, CacheView], list[KvEventSubscriber]]:
    """A view per MD: exact (with its subscriber) where its KV events are given, else approximate."""
    sources = sources or {}
    unknown = set(sources) - set(urls)
    if unknown:
        raise ValueError(f"KV events given for unknown main peers {sorted(unknown)}")
    views: dict[str, CacheView] = {}
    subscribers: list[KvEventSubscriber] = []
    for url in urls:
        if url in sources:
            view = ExactCacheView(PrefixView(), name=url)
            subscribers.append(KvEventSubscriber(sources[url], view))
            views[url] = view
        else:
            views[url] = PrefixView()
    return views, subscribers
