"""The relay half of the request lifecycle: P->RLD->MD and P->RLD (a mixin of `Cluster`).

RLD gets the full KV by RDMA and decodes at once; MD gets the missed KV over the WAN and says
"ready"; RLD hands the eager token IDs over (one-shot, or catch-up in rounds) and MD recomputes
them in EXTEND steps, then decodes the rest. If RLD finishes first, MD's transfer is cancelled
or, with `align_md_cache`, still lands so MD's radix cache keeps up with P's.

The mixin uses the cluster's `loop`, `spec`, `R`, `D`, `wan`, `drc`, `handoff`, `half_rtt`,
`states`, `_tails`, `_orphans` and its `_p_done_one`, `_complete`, `_md_finish`,
`_md_start_direct`.
"""

from __future__ import annotations

import math
from typing import Optional

from sglang_pdd.policy.handoff_mode import HandoffLoad, HandoffMode
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.lab.sim.cost_model import Chunk
from sglang_pdd.lab.sim.prefill import PrefillJob
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.wan import Transfer
from sglang_pdd.lab.workload.request import WorkloadRequest


class RequestState:
    """Where one request is: the cluster's per-request bookkeeping."""

    __slots__ = ("w", "rec", "job", "p", "d", "r", "pending_p", "wan_tr", "wan_start", "rld",
                 "md", "k_md", "k_sent", "rounds", "last_gap", "md_ready", "rld_last_tok_s")

    def __init__(self, w: WorkloadRequest, rec: RequestRecord):
        self.w, self.rec = w, rec
        self.job: Optional[PrefillJob] = None
        self.p = self.d = self.r = -1
        self.pending_p = 0
        self.wan_tr: Optional[Transfer] = None
        self.wan_start = 0.0
        self.rld = "none"  # none|waiting|admitted|running|handed|done|skipped
        self.md = "none"  # none|waiting|reserved|kv|extending|running|done|cancelled
        self.k_md = 0  # eager tokens MD has recomputed
        self.k_sent = 0
        self.rounds = 0
        self.last_gap = math.inf
        self.md_ready = False
        self.rld_last_tok_s = 0.0


class RelayFlow:
    """RLD admission, eager decoding, the handoff to MD, and RLD finishing on its own."""

    def _md_cache_prompt(self, st: RequestState) -> None:
        if self.drc is not None:
            self.drc[st.d].insert_prompt(st.w)

    def _cancel_md(self, st: RequestState) -> None:
        """RLD finished the request. Odd traffic (P->RLD routes never start MD) aside, a relayed
        request keeps its WAN transfer when `align_md_cache` is on, so MD's radix cache stays
        aligned with P's (docs/sim.md); otherwise the transfer is cancelled."""
        rid = st.w.request_id
        if self.spec.align_md_cache and st.md in ("waiting", "reserved"):
            self._tails[rid] = st
            return
        if st.md in ("kv", "extending"):
            self._md_cache_prompt(st)
        if st.md == "waiting":
            self.D[st.d].withdraw(rid)
            self._p_done_one(st)
        elif st.md == "reserved":
            if st.wan_tr is not None:
                self.wan.cancel(st.wan_tr)
                st.wan_tr = None
            self._p_done_one(st)
            self.D[st.d].release(rid)
        elif st.md == "kv":
            self.D[st.d].release(rid)
        elif st.md == "extending":  # a handoff step is in flight: its callback releases
            self._orphans[rid] = st.d
        st.md = "cancelled"

    def _orphan_release(self, rid: str) -> bool:
        d = self._orphans.pop(rid, None)
        if d is None:
            return False
        self.D[d].release(rid)
        return True

    # ----- RLD -----
    def _rld_admitted(self, rid: str) -> None:
        st = self.states[rid]
        st.rld = "admitted"
        hit = self.rc[st.r].hit_req(st.w) if self.rc is not None else 0  # block-level traces
        self.loop.after(self._fast_s((st.w.input_len - hit) * self.kv), self._rld_kv_arrived, rid)

    def _rld_kv_arrived(self, rid: str) -> None:
        st = self.states.get(rid)
        if st is None:
            return
        self._p_done_one(st)
        if st.rld == "skipped":
            self.R[st.r].release(rid)
            return
        if self.rc is not None:
            self.rc[st.r].insert_prompt(st.w)
        now = self.loop.now
        st.rec.first_token_s = now
        st.rld = "running"
        rest = st.w.max_output_tokens - 1
        if rest <= 0:
            self._rld_finish(rid)
            return
        self.R[st.r].join(rid, st.w.input_len + 1, rest, self._rld_finish)
        if st.md_ready:
            self._ready_at_rld(rid)

    def _rld_finish(self, rid: str) -> None:
        st = self.states[rid]
        st.rld = "done"
        st.rec.tokens_rld = st.w.max_output_tokens
        self.R[st.r].release(rid)
        if self.rc is not None:
            self.rc[st.r].insert_finished(st.w)
        if st.md not in ("none", "cancelled"):
            self._cancel_md(st)
        self._complete(st, self.loop.now)

    def _ready_at_rld(self, rid: str) -> None:
        st = self.states.get(rid)
        if st is None:
            return
        if st.rld == "waiting":  # RLD never got to it: MD serves it directly
            if self.R[st.r].withdraw(rid):
                st.rld = "skipped"
                self._p_done_one(st)
                st.rec.pipeline = Pipeline.P_MD.value
                st.rec.route_reason += "; MD ready before RLD admitted it"
                self._md_start_direct(st)
                return
        if st.rld == "admitted":
            st.md_ready = True
            return
        R, D = self.R[st.r], self.D[st.d]
        load = HandoffLoad(len(R.running), R.kv_usage, len(D.running))
        mode = self.handoff.decide(load).mode
        st.rec.handoff_mode = mode.value
        st.md = "extending"
        if mode is HandoffMode.ONE_SHOT:
            self._rld_stop_and_send(st)
        else:
            st.k_sent = 1 + R.produced(rid)
            self.loop.after(self.half_rtt, self._md_extend, rid, st.k_sent, False)

    def _rld_stop_and_send(self, st: RequestState) -> None:
        rid = st.w.request_id
        R = self.R[st.r]
        produced = 1 + R.leave(rid)
        R.release(rid)
        st.rld = "handed"
        st.rec.tokens_rld = produced
        st.rld_last_tok_s = self.loop.now
        self.loop.after(self.half_rtt, self._md_extend, rid, produced, True)

    def _md_extend(self, rid: str, k_total: int, final: bool) -> None:
        st = self.states.get(rid)
        if st is None:
            self._orphan_release(rid)
            return
        new = k_total - st.k_md
        chunk = Chunk(max(new, 1), st.w.input_len + st.k_md)
        st.k_md = k_total
        self.D[st.d].extend(rid, chunk, lambda key, f=final: self._md_extended(key, f))

    def _md_extended(self, rid: str, final: bool) -> None:
        st = self.states.get(rid)
        if st is None:
            self._orphan_release(rid)
            return
        if not final:
            self.loop.after(self.half_rtt, self._catch_up_poll, rid)
            return
        now = self.loop.now
        st.md = "running"
        st.rec.handoff_gap_s = now + self.half_rtt - st.rld_last_tok_s
        rest = st.w.max_output_tokens - st.k_md
        st.rec.tokens_md = rest
        if rest <= 1:
            self._md_finish(rid)
            return
        self.D[st.d].join(rid, st.w.input_len + st.k_md + 1, rest - 1, self._md_finish)

    def _catch_up_poll(self, rid: str) -> None:
        st = self.states.get(rid)
        if st is None:
            self._orphan_release(rid)
            return
        R = self.R[st.r]
        produced = 1 + R.produced(rid)
        gap = produced - st.k_sent
        st.rounds += 1
        stop = (self.handoff.catch_up_done(gap) or st.rounds >= self.spec.max_catch_up_rounds
                or gap >= st.last_gap)
        st.last_gap = gap
        if stop:
            self._rld_stop_and_send(st)
        else:
            st.k_sent = produced
            self.loop.after(self.half_rtt, self._md_extend, rid, produced, False)
