"""sglang's KV events, from MainDecode's publisher to the router's `ExactCacheView`.

Wire format (sglang 0.5.23, `--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:PORT"}'`,
`sglang/srt/disaggregation/kv_events.py`): a ZMQ PUB socket sends one three-frame message per batch,
`[topic, seq, payload]`: `seq` an 8-byte big-endian counter from 0 per publisher process, `payload`
msgpack `[ts, events, attn_dp_rank]`; each event a map tagged by `type`: `BlockStored`
(block_hashes, parent_block_hash, token_ids, block_size, medium, ...), `BlockRemoved` (block_hashes,
medium), `AllBlocksCleared`. With `"replay_endpoint": "tcp://*:PORT2"` a ROUTER socket answers a
request `[b"", start_seq]` with every buffered batch from there, `[b"", topic, seq, payload]` each,
then `[b"", b"", -1, b""]`.

`KvEventFeed` (plain, no sockets) orders the frames: it applies each batch once, in sequence, and
asks for a replay when it sees a gap or has no history (`resync_from`). A replay from the last
applied batch proves the history continuous when that batch comes back unchanged; a batch number seen
again with other content means the publisher restarted (MD's cache restarted empty). What cannot be
replayed makes the view stale (see `exact_view`). Malformed messages are counted and skipped; a lost
batch also makes the view stale. The ZMQ side, a task on the router's loop, is `kv_subscriber`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import msgspec

from sglang_pdd.router.cache.exact_view import ExactCacheView

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventError(ValueError):
    """A message that is not one of sglang's KV event batches; `reason` labels the counter."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# -- the payload (mirrors sglang's structs; unknown fields are ignored, as sglang adds optional ones)
class BlockStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[Union[int, tuple[int, int]]]  # EAGLE's bigram keys send (token, next) pairs
    block_size: int
    lora_id: Optional[int] = None
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    lora_name: Optional[str] = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[int]
    medium: Optional[str] = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


KvEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KvEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KvEvent]
    attn_dp_rank: Optional[int] = None


_decoder = msgspec.msgpack.Decoder(KvEventBatch)


def decode_batch(payload: bytes) -> KvEventBatch:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise KvEventError("bad-payload", str(e)) from None


def parse_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise KvEventError("bad-seq", f"sequence frame of {len(raw)} bytes, expected 8")
    return int.from_bytes(raw, "big")


@dataclass
class FeedStats:
    batches: int = 0
    events: int = 0
    duplicates: int = 0
    gaps: int = 0
    disconnects: int = 0
    restarts: int = 0
    replays: int = 0
    unknown_removed: int = 0  # hashes removed that the view never saw stored
    foreign: int = 0  # stores in another cache namespace (salt, LoRA): never a hit for the router
    malformed: dict[str, int] = field(default_factory=dict)


class KvEventFeed:
    """One publisher's batches, in order, onto one view."""

    def __init__(self, view: ExactCacheView, *, can_replay: bool, window: int = 4096,
                 replay_retry_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.view, self._has_replay, self.window = view, can_replay, window
        self.replay_retry_s, self._clock = replay_retry_s, clock
        self._replay_down_until = float("-inf")  # a replay that did not answer: gaps go stale meanwhile
        self.stats = FeedStats()
        self.last_seq: int | None = None
        self._recent: OrderedDict[int, bytes] = OrderedDict()  # seq -> digest of applied batches
        self._held: tuple[int, bytes] | None = None  # the live batch that revealed a gap
        self.resync_from: int | None = None  # set: the subscriber should replay from here
        self._dropped_exact = False  # the connection dropped while the view was exact
        if can_replay:
            self.resync_from = 0  # learn MD's history before trusting anything

    @property
    def can_replay(self) -> bool:
        return self._has_replay and self._clock() >= self._replay_down_until

    # -- the connection ----------------------------------------------------------------------------
    def on_disconnect(self) -> None:
        """The publisher's connection dropped (heartbeat timeout, reset): batches published until it is
        back are lost to us, so the view is stale until the next batch shows none was (its number follows
        ours) or a replay continues our history."""
        self.stats.disconnects += 1
        if self.view.exact:
            self._dropped_exact = True
        self.view.mark_stale("lost the connection to MD's KV event publisher")
        if self.can_replay and self.last_seq is not None and self.resync_from is None:
            self.resync_from = self.last_seq

    # -- live messages --------------------------------------------------------------------------
    def on_message(self, frames: list[bytes]) -> None:
        """One live message `[topic, seq, payload]`; never raises (bad ones are counted)."""
        if len(frames) != 3:
            self.count_malformed("bad-frames", f"{len(frames)} frames, expected 3")
            return
        try:
            seq = parse_seq(frames[1])
        except KvEventError as e:
            self.count_malformed(e.reason, str(e))
            return
        self.on_batch(seq, frames[2])

    def on_batch(self, seq: int, payload: bytes) -> None:
        if self._dropped_exact and self.last_seq is not None and seq == self.last_seq + 1:
            self.view.mark_exact("the first batch after a reconnection follows ours")
        self._dropped_exact = False
        if self.last_seq is not None and seq <= self.last_seq:
            if self._recent.get(seq) == _digest(payload):
                self.stats.duplicates += 1
                return
            self._restart(f"batch {seq} again after {self.last_seq} with other content")
        if self.last_seq is None and seq != 0:
            if self.can_replay:
                self._held, self.resync_from = (seq, payload), 0
                return
            self.view.mark_stale(f"subscribed at batch {seq}: MD's earlier events are unknown")
        elif self.last_seq is not None and seq != self.last_seq + 1:
            self.stats.gaps += 1
            if self.can_replay:
                self._held, self.resync_from = (seq, payload), self.last_seq
                return
            self.view.mark_stale(f"lost batches {self.last_seq + 1}..{seq - 1} and no replay endpoint")
        elif seq == 0:
            self.view.mark_exact("from MD's first batch")
        self._apply(seq, payload)

    # -- replay -------------------------------------------------------------------------------
    def on_replay(self, start: int, batches: list[tuple[int, bytes]] | None) -> None:
        """What a replay from `start` (the `resync_from` asked for) returned; None: no answer."""
        self.resync_from = None
        self.stats.replays += 1
        held, self._held = self._held, None
        if batches is None:
            self._replay_down_until = self._clock() + self.replay_retry_s
            self.view.mark_stale("the replay endpoint did not answer")
        elif start > 0:  # from our last batch: continuous iff it comes back unchanged
            if batches and batches[0][0] == start and self._recent.get(start) == _digest(batches[0][1]):
                if self._dropped_exact:
                    self.view.mark_exact("a replay after a reconnection continued our history")
                self._dropped_exact = False
                self._apply_run(batches[1:])
            else:
                self._restart("replay does not continue the batches applied so far")
                self._held, self.resync_from = held, 0
                return
        elif batches and batches[0][0] == 0:
            self.view.clear()
            self.last_seq = None
            self._recent.clear()
            self.view.mark_exact("replayed MD's history from its first batch")
            self._apply_run(batches)
        elif not batches and held is None and self.last_seq is None:
            self.view.clear()
            self.view.mark_exact("MD has published nothing yet")
        else:
            self.view.mark_stale("MD's first batches are no longer in its replay buffer")
            self._apply_run(batches)
        if held is not None:  # it was published before the replay request: covered, or a gap
            if self.last_seq is None or held[0] > self.last_seq:
                if self.last_seq is not None and held[0] != self.last_seq + 1:
                    self.view.mark_stale(f"replay ended at {self.last_seq}, before batch {held[0]}")
                elif self.last_seq is None and held[0] != 0:
                    self.view.mark_stale(f"no replayed history before batch {held[0]}")
                self._apply(*held)

    def _apply_run(self, batches: list[tuple[int, bytes]]) -> None:
        for seq, payload in batches:
            if self.last_seq is not None and seq <= self.last_seq:
                continue
            if self.last_seq is not None and seq != self.last_seq + 1:
                self.view.mark_stale(f"replay skipped batches {self.last_seq + 1}..{seq - 1}")
            self._apply(seq, payload)

    def _restart(self, why: str) -> None:
        """The publisher's history broke (MD restarted): its cache started empty at batch 0."""
        self.stats.restarts += 1
        logger.warning("%s: KV events: %s; relearning MD's cache", self.view.name, why)
        self.view.clear()
        self.view.mark_stale(why)
        self.last_seq = None
        self._recent.clear()

    # -- applying one batch -----------------------------------------------------------------------
    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        self._recent[seq] = _digest(payload)
        while len(self._recent) > self.window:
            self._recent.popitem(last=False)
        try:
            batch = decode_batch(payload)
            for ev in batch.events:
                self._apply_event(ev)
        except (KvEventError, ValueError) as e:
            self.count_malformed(getattr(e, "reason", "bad-event"), f"batch {seq}: {e}")
            self.view.mark_stale(f"batch {seq} could not be applied")
            return
        self.stats.batches += 1
        self.stats.events += len(batch.events)

    def _apply_event(self, ev: KvEvent) -> None:
        if isinstance(ev, BlockStored):
            if ev.cache_salt is not None or ev.lora_name is not None or ev.lora_id is not None:
                self.stats.foreign += 1
                return
            ids = [t if isinstance(t, int) else t[0] for t in ev.token_ids]
            self.view.store(ev.block_hashes, ev.parent_block_hash, ids, ev.block_size, ev.medium or "GPU")
        elif isinstance(ev, BlockRemoved):
            self.stats.unknown_removed += self.view.remove(ev.block_hashes, ev.medium or "GPU")
        else:  # whatever was lost before, MD's cache is known from here on
            self.view.clear()
            self.view.mark_exact("MD cleared its cache")

    def count_malformed(self, reason: str, detail: str) -> None:
        n = self.stats.malformed.get(reason, 0)
        self.stats.malformed[reason] = n + 1
        (logger.warning if n == 0 else logger.debug)("%s: skipped a KV event message (%s): %s",
                                                     self.view.name, reason, detail)


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()
