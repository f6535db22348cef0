"""Decode-side radix cache (DRC) of one MD instance, at session granularity.

Sessions of an agentic workload share little beyond their agent's system prompt, so the cache
is modelled as one cached token sequence per session (the last one MD finished for it), with
LRU eviction of whole sessions when the token capacity is exceeded. The hit of a new prompt is
its exact common prefix with the cached sequence (segments compare exactly, see
`sglang_pdd.lab.workload.request.common_prefix_len`). A turn that never reaches MD (P->RLD alone)
leaves MD's copy stale: that is how the relay-only oscillation arises (docs/sim.md, Oscillation).
Block-level traces use `block_cache.BlockRadixCache` instead; both offer the request-level
methods `peek_req`, `hit_req`, `insert_prompt` and `insert_finished` the cluster calls.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from sglang_pdd.lab.workload.request import Segment, WorkloadRequest, common_prefix_len, output_segment


class DecodeRadixCache:
    def __init__(self, capacity_tokens: int):
        self.capacity = capacity_tokens
        self._entries: OrderedDict[int, tuple[tuple[Segment, ...], int]] = OrderedDict()
        self.tokens = 0
        self.evictions = 0

    def hit(self, session: int, prompt: Sequence[Segment], input_len: int) -> int:
        """The hit of a prompt MD now serves (refreshes the session's place in the LRU)."""
        n = self.peek(session, prompt, input_len)
        if session in self._entries:
            self._entries.move_to_end(session)
        return n

    def peek(self, session: int, prompt: Sequence[Segment], input_len: int) -> int:
        """The hit, leaving the LRU as it is (the router scoring candidates)."""
        e = self._entries.get(session)
        if e is None:
            return 0
        return min(common_prefix_len(e[0], prompt), input_len - 1) if input_len > 0 else 0

    def insert(self, session: int, sequence: Sequence[Segment]) -> None:
        n = sum(s.length for s in sequence)
        old = self._entries.pop(session, None)
        if old is not None:
            self.tokens -= old[1]
        if n > self.capacity:
            return
        self._entries[session] = (tuple(sequence), n)
        self.tokens += n
        while self.tokens > self.capacity:
            _, (_, m) = self._entries.popitem(last=False)
            self.tokens -= m
            self.evictions += 1

    # ----- request level (the interface `Cluster` uses for every prefix cache) -----
    def peek_req(self, w: WorkloadRequest) -> int:
        return self.peek(w.session_id, w.segments, w.input_len)

    def hit_req(self, w: WorkloadRequest) -> int:
        return self.hit(w.session_id, w.segments, w.input_len)

    def insert_prompt(self, w: WorkloadRequest) -> None:
        self.insert(w.session_id, w.segments)

    def insert_finished(self, w: WorkloadRequest) -> None:
        self.insert(w.session_id, list(w.segments) + [output_segment(w.turn, w.max_output_tokens)])
