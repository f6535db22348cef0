"""MainRuntime with the test-only negative controls and knobs (test_switches.TestKnobs); never in production.

`for_process` gives MD rank 0 its runtime once, when the role starts (decode/runtime.py): the plain
`MainRuntime` in production, `ControlledMainRuntime` when the process's test switches are on; it
overrides the no-op hooks `MainRuntime` calls, so the serving path carries no test branch. The knobs
are re-read at each use (a test changes them while the server runs).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.main.handoff_attention import ATTENTION, CPU_TEST_POLICY, HandoffAttention
from sglang_pdd.decode.main.runtime import MainRuntime
from sglang_pdd import test_switches
from sglang_pdd.test_switches import TestSwitches

logger = logging.getLogger(__name__)


def for_process(scheduler, cfg: PddConfig, secret: bytes, switches: TestSwitches | None = None) -> MainRuntime:
    """Rank 0's runtime: the plain class, or with any test switch on (the process's by default) the
    controlled one."""
    switches = switches if switches is not None else test_switches.for_process()
    if switches.controlled:
        return ControlledMainRuntime(scheduler, cfg, secret, switches)
    return MainRuntime(scheduler, cfg, secret)


class ControlledMainRuntime(MainRuntime):
    """MainRuntime under test switches: `drop_eager_kv`, `corrupt_cached_prefix`, `main_gather_handoffs`,
    `main_skip_grammar_advance` and `handoff_kernel_cpu`."""

    def __init__(self, scheduler, cfg: PddConfig, secret: bytes, switches: TestSwitches,
                 attention: HandoffAttention = ATTENTION):
        super().__init__(scheduler, cfg, secret, attention=attention)
        self.switches = switches
        self._drop_after_extend: list = []  # (req, n, k) whose eager KV is discarded before the next selection

    def _track(self, req: Any, params) -> str | None:
        """`drop_eager_kv` (with SGLANG_PDD_TESTING=1): mark the request as it is admitted."""
        return self.handoff.admit(req, params, drop_eager_kv=self.switches.drop_eager_kv())

    def _before_poll(self) -> None:
        """`corrupt_cached_prefix`: zero the reused prefix of each request new in the waiting queue."""
        s = self.scheduler
        if self.switches.on and s.waiting_queue and self.switches.knobs().corrupt_cached_prefix:
            self._corrupt_cached_prefix([r for r in s.waiting_queue if not getattr(r, "_pdd_corrupted", False)])

    def _attention_policy(self):
        """`handoff_kernel_cpu`: the handoff attention's torch reference, on CPU too."""
        return CPU_TEST_POLICY if self.switches.on and self.switches.knobs().handoff_kernel_cpu else None

    def _before_select(self) -> None:
        """`drop_eager_kv`: the EXTEND marked last iteration has run; discard what it wrote."""
        if self._drop_after_extend:
            self._discard_eager_kv()

    def _hold_finals(self) -> bool:
        """`main_gather_handoffs`: no final handoff EXTEND before that many are ready."""
        ready = self.handoff.ready_finals() if self.switches.on else 0
        return bool(ready) and ready < self.switches.knobs().main_gather_handoffs

    def _after_final_extend(self, items: list) -> None:
        """`drop_eager_kv`: remember the marked requests, and keep their KV out of the radix cache.
        `main_skip_grammar_advance`: undo the grammar's advance over the eager tokens."""
        if self.switches.testing:
            for p in items:
                if p.drop_eager_kv:
                    p.req.skip_radix_cache_insert = True  # never publish the corrupted KV
                    self._drop_after_extend.append((p.req, len(p.req.origin_input_ids), len(p.req.output_ids)))
            if self.switches.on and self.switches.knobs().main_skip_grammar_advance:
                self._skip_grammar_advance(items)

    @staticmethod
    def _skip_grammar_advance(items: list) -> None:
        """Negative control: roll the grammar back over the tokens the EXTEND accepted, as if MD skipped
        them; its vocabulary mask (computed when the batch runs) is then the wrong state's."""
        for p in items:
            g = p.req.grammar
            n = min(len(p.tokens), len(getattr(g, "accepted_tokens", ()))) if g is not None else 0
            if n:
                g.rollback(n)
                logger.warning("sglang-pdd test knob: grammar of %s rolled back over %d eager tokens", p.req.rid, n)

    def _discard_eager_kv(self) -> None:
        """Negative control: zero the KV the EXTEND wrote for t1..t(k-1), as if it never ran."""
        s = self.scheduler
        pool = s.token_to_kv_pool_allocator.get_kvcache()
        for req, n, k in self._drop_after_extend:
            if req.finished() or k < 2:
                continue
            locs = s.req_to_token_pool.req_to_token[req.kv.req_pool_idx, n:n + k - 1].long()
            for layer in range(pool.start_layer, pool.start_layer + pool.layer_num):
                pool.get_key_buffer(layer)[locs] = 0
                pool.get_value_buffer(layer)[locs] = 0
        self._drop_after_extend.clear()

    def _corrupt_cached_prefix(self, reqs: list) -> None:
        """Negative control of the decode radix cache: zero the KV of the prefix a request reuses."""
        s = self.scheduler
        pool = s.token_to_kv_pool_allocator.get_kvcache()
        for req in reqs:
            req._pdd_corrupted = True
            n = int(getattr(req.kv, "cache_protected_len", 0) or 0)
            if n == 0 or req.kv.req_pool_idx is None:
                continue
            locs = s.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :n].long()
            for layer in range(pool.start_layer, pool.start_layer + pool.layer_num):
                pool.get_key_buffer(layer)[locs] = 0
                pool.get_value_buffer(layer)[locs] = 0
            logger.warning("sglang-pdd test knob: zeroed the %d cached prefix tokens of %s", n, req.rid)
