"""One deployment under simulation: pools, links, and every request's life through them.

Request lifecycle (times are as seen by the router, which sits in cluster A with P and RLD;
anything MD emits reaches it half an RTT later):

* PD (same-DC or cross-DC): P prefills -> D reserves KV -> KV moves (RDMA or WAN) -> D emits the
  first token (computed by P) and decodes the rest.
* PDD P->MD: as PD over the WAN, only the KV past MD's radix hit crosses.
* PDD P->RLD->MD: RLD and MD reserve in parallel; RLD gets the full KV over RDMA and decodes at
  once (eager tokens); MD gets the missed KV over the WAN, says "ready", RLD sends token IDs
  (one-shot: all, and stops; catch-up: chunks while decoding, until MD is close), MD recomputes
  them in an EXTEND step and continues. If RLD finishes first, the WAN transfer is cancelled.
* PDD P->RLD: odd traffic (or the relay-only experiment): RLD decodes everything, MD never sees
  the turn, so MD's radix cache for that session goes stale.
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Optional

from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.handoff_mode import HandoffModePolicy
from sglang_pdd.policy.peer_choice import Candidate, ChoiceConfig, PeerChooser
from sglang_pdd.policy.pipeline import Pipeline, PipelinePolicy, PipelinePolicyConfig, RouteInputs
from sglang_pdd.lab.sim.block_cache import BlockRadixCache
from sglang_pdd.lab.sim.cost_model import CostModel
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.drc import DecodeRadixCache
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.hardware import Efficiency, InstanceSpec
from sglang_pdd.lab.sim.model import ModelSpec
from sglang_pdd.lab.sim.prefill import PrefillInstance, PrefillJob
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.relay import RelayFlow, RequestState
from sglang_pdd.lab.sim.systems import Arch, PoolSpec, SystemSpec
from sglang_pdd.lab.sim.wan import Transfer, WanLink
from sglang_pdd.lab.workload.request import WorkloadRequest

logger = logging.getLogger(__name__)

# cache-aware choice of P on block-level traces (in the manner of sglang-router's cache_aware
# policy; the values are assumptions): balance first, then the longest cached prefix
P_BALANCE_ABS_TOKENS = 32_768  # queued-token gap above which the queue decides ...
P_BALANCE_REL = 1.5  # ... when the longest queue is also this many times the shortest
P_CACHE_THRESHOLD = 0.3  # below this hit rate at the best P, go to the P caching least


def decode_max_batch(cost: CostModel, pool: PoolSpec, context_tokens: int, tpot_target_s: float,
                     cap: int = 512) -> int:
    """Largest batch whose decode step meets `tpot_target_s` at `context_tokens` per request
    and whose KV fits (an operator's --max-running-requests); at least 1."""
    if pool.max_batch is not None:
        return pool.max_batch
    fit = max(1, cost.kv_capacity_tokens // max(context_tokens, 1))
    b = 1
    while b < min(fit, cap) and cost.decode_step_s(b + 1, (b + 1) * context_tokens) <= tpot_target_s:
        b += 1
    return b


def pool_cost(model: ModelSpec, pool: PoolSpec, eff: Efficiency) -> CostModel:
    """The cost model of one instance of `pool`."""
    return CostModel(model, InstanceSpec(pool.chip, pool.chips_per_instance, eff))


class Cluster(RelayFlow):
    def __init__(self, spec: SystemSpec, model: ModelSpec, eff: Efficiency = Efficiency(),
                 context_tokens: int = 65_000, tpot_target_s: float = 0.1):
        self.spec, self.model, self.loop = spec, model, EventLoop()
        self.context_tokens = context_tokens  # the typical context the batches are sized for
        self.kv = model.kv_bytes_per_token
        lp = self.loop

        pc = pool_cost(model, spec.prefill, eff)
        self.P = [PrefillInstance(lp, pc, f"P{i}", spec.chunk_size, spec.tail_chunk_batching,
                                  self._prefilled) for i in range(spec.prefill.instances)]
        dc = pool_cost(model, spec.decode, eff)
        self.d_batch = decode_max_batch(dc, spec.decode, context_tokens, tpot_target_s)
        self.D = [DecodeInstance(lp, dc, f"D{i}", self.d_batch) for i in range(spec.decode.instances)]
        self.R: list[DecodeInstance] = []
        self.r_batch = 0
        if spec.relay is not None and spec.arch is Arch.PDD:
            rc = self._relay_cost(model, spec.relay, eff)
            self.r_batch = decode_max_batch(rc, spec.relay, context_tokens, tpot_target_s)
            self.R = [DecodeInstance(lp, rc, f"R{i}", self.r_batch) for i in range(spec.relay.instances)]
        self.wan = WanLink(lp, spec.wan) if spec.wan is not None else None
        self.half_rtt = spec.wan.rtt_s / 2 if spec.wan is not None else 0.0
        self.drc = [DecodeRadixCache(spec.drc_capacity_tokens) for _ in self.D] if spec.drc else None
        self.pc: Optional[list[BlockRadixCache]] = None  # P's and RLD's caches: block-level traces
        self.rc: Optional[list[BlockRadixCache]] = None
        self.policy: Optional[PipelinePolicy] = None
        if spec.arch is Arch.PDD:
            rt = spec.routing
            self.bw = BandwidthEstimator(spec.wan.bytes_per_s * 0.5, rtt_s=spec.wan.rtt_s)
            rld_tpot = self.R[0].cost.decode_step_s(max(1, self.r_batch // 2),
                                                    max(1, self.r_batch // 2) * context_tokens)
            self.policy = PipelinePolicy(PipelinePolicyConfig(
                kv_bytes_per_token=self.kv, wan_budget_s=rt.wan_budget_s, route_by=rt.route_by,
                hit_threshold=rt.hit_threshold, odd_output_threshold=rt.odd_output_threshold,
                rld_tpot_s=rld_tpot, allow_relay_only=rt.allow_relay_only,
                relay_only_below_hit=rt.relay_only_below_hit,
                relay_only_max_rld_usage=rt.relay_only_max_rld_usage), self.bw, spec.wan.rtt_s)
        self.md_chooser = PeerChooser(ChoiceConfig(spec.routing.md_choice))
        self.handoff = HandoffModePolicy(spec.handoff)
        self.states: dict[str, RequestState] = {}
        self.records: list[RequestRecord] = []
        self.finish_count: dict[str, int] = {}
        self.fast_bytes = 0.0
        self._orphans: dict[str, int] = {}  # MD reservations whose RLD finished mid-handoff
        self._tails: dict[str, RequestState] = {}  # finished on RLD, MD still receiving the prompt KV
        self._later: dict[int, list[WorkloadRequest]] = {}  # closed loop: turns not yet released
        self.closed_loop = True

    # ----- driving -----
    def run(self, requests: Iterable[WorkloadRequest], until: float = math.inf,
            closed_loop: bool = True) -> list[RequestRecord]:
        """Replay `requests`. Closed loop (default): a session's first request arrives at its
        `arrival_s`, each later turn `think_s` after the previous one completes (an agent waits
        for its answer). Open loop: every request at its `arrival_s`."""
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.turn))
        self.closed_loop = closed_loop
        if any(r.block_ids for r in reqs):
            self._use_block_caches()
        first: list[WorkloadRequest] = []
        if closed_loop:
            seen: set[int] = set()
            for r in sorted(reqs, key=lambda r: (r.session_id, r.turn)):
                if r.session_id in seen and not r.warmup:
                    self._later.setdefault(r.session_id, []).append(r)
                else:
                    first.append(r)
                    if not r.warmup:
                        seen.add(r.session_id)
            for lst in self._later.values():
                lst.reverse()  # pop() gives the next turn
            first.sort(key=lambda r: (r.arrival_s, r.turn))
        else:
            first = reqs
        t0 = min((r.arrival_s for r in first), default=0.0)
        self.loop.now = min(0.0, t0)
        it = iter(first)

        def feed() -> None:
            w = next(it, None)
            if w is not None:
                self.loop.at(max(w.arrival_s, self.loop.now), self._arrive_then, w, feed)

        feed()
        self.loop.run(until)
        return self.records

    def _arrive_then(self, w: WorkloadRequest, feed) -> None:
        self._arrive(w)
        feed()

    def _release_next(self, session: int, t_done: float) -> None:
        lst = self._later.get(session)
        if lst:
            w = lst.pop()
            self.loop.at(t_done + w.think_s, self._arrive, w)

    def _use_block_caches(self) -> None:
        """Block-level trace: every cache is a bounded LRU radix cache over blocks shared by all
        requests (docs/sim.md, "Block-level prefix caches"). P and RLD cache in their KV pool,
        MD in its DRC capacity (HBM + host DRAM)."""
        if self.spec.drc:
            self.drc = [BlockRadixCache(self.spec.drc_capacity_tokens) for _ in self.D]
        self.pc = [BlockRadixCache(p.capacity) for p in self.P]
        self.rc = [BlockRadixCache(r.capacity) for r in self.R] or None

    # ----- helpers -----
    def _md_of(self, w: WorkloadRequest) -> int:
        """The router's own choice (`policy.peer_choice`): each MD's radix hit for this prompt, the
        predicted WAN time of what it misses (PDD), its load and KV usage."""
        cands = []
        for i, d in enumerate(self.D):
            hit = self.drc[i].peek_req(w) if self.drc is not None else 0
            wan = (self.policy.predict_wan_s((w.input_len - hit) * self.kv) if self.policy is not None else None)
            cands.append(Candidate(d.name, hit=hit, load=d.load, kv_usage=d.kv_usage, wan_s=wan))
        return self.md_chooser.choose(cands, w.input_len).index

    def _fast_s(self, nbytes: float) -> float:
        self.fast_bytes += nbytes
        return nbytes / (self.spec.rdma_gbps * 1e9 / 8) + self.spec.rdma_latency_s

    def _p_done_one(self, st: RequestState) -> None:
        st.pending_p -= 1
        if st.pending_p == 0 and st.job is not None:
            self.P[st.p].release(st.job)

    def _complete(self, st: RequestState, t: float) -> None:
        rid = st.w.request_id
        self.finish_count[rid] = self.finish_count.get(rid, 0) + 1
        if st.rec.finished:
            raise RuntimeError(f"{rid} finished twice")
        st.rec.finish_s, st.rec.finished = t, True
        del self.states[rid]
        if self.closed_loop:
            self._release_next(st.w.session_id, t)

    # ----- hooks (the relay variants of `elastic_relay` and `colocated_relay` override them) -----
    def _relay_cost(self, model: ModelSpec, pool: PoolSpec, eff: Efficiency) -> CostModel:
        return pool_cost(model, pool, eff)

    def _route(self, w: WorkloadRequest, md_hit: int) -> tuple[Pipeline, str]:
        if self.policy is None:
            return Pipeline.P_MD, "PD"
        rld_usage = sum(r.occupancy for r in self.R) / len(self.R)
        dec = self.policy.decide(RouteInputs(w.input_len, md_hit, w.max_output_tokens, rld_usage))
        return dec.pipeline, dec.reason

    def _p_eligible(self) -> range:
        return range(len(self.P))

    def _pick_p(self) -> int:
        return min(self._p_eligible(), key=lambda i: self.P[i].queued_tokens)

    def _pick_p_cached(self, w: WorkloadRequest) -> int:
        """With P caches (block-level traces): the queue decides when the P queues are out of
        balance, else the longest cached prefix if it is at least `P_CACHE_THRESHOLD` of the
        prompt, else the P caching least (spreads new prefixes)."""
        elig = self._p_eligible()
        short = self._pick_p()
        lo, hi = self.P[short].queued_tokens, max(self.P[i].queued_tokens for i in elig)
        if hi - lo > P_BALANCE_ABS_TOKENS and hi > P_BALANCE_REL * lo:
            return short
        hits = {i: self.pc[i].peek_req(w) for i in elig}
        best = max(elig, key=lambda i: (hits[i], -self.P[i].queued_tokens))
        if hits[best] >= P_CACHE_THRESHOLD * w.input_len:
            return best
        return min(elig, key=lambda i: (self.pc[i].tokens, self.P[i].queued_tokens))

    def _pick_rld(self, st: RequestState) -> int:
        return min(range(len(self.R)), key=lambda i: self.R[i].load)

    # ----- arrival and prefill -----
    def _arrive(self, w: WorkloadRequest) -> None:
        if w.warmup:
            if self.drc is not None:
                self.drc[self._md_of(w)].insert_prompt(w)
            return
        d = self._md_of(w)
        md_hit = self.drc[d].hit_req(w) if self.drc else 0
        pipeline, reason = self._route(w, md_hit)
        p = self._pick_p_cached(w) if self.pc is not None else self._pick_p()
        p_hit = self.pc[p].hit_req(w) if self.pc is not None else w.prefix_hit_len
        rec = RequestRecord(w.request_id, w.session_id, w.turn, self.loop.now, w.input_len,
                            w.max_output_tokens, p_hit, md_hit, pipeline.value, reason, w.odd)
        self.records.append(rec)
        st = RequestState(w, rec)
        st.d = d
        self.states[w.request_id] = st
        st.p = p
        st.job = PrefillJob(w.request_id, w.input_len, p_hit)
        self.P[st.p].submit(st.job)

    def _prefilled(self, rid: str) -> None:
        st = self.states[rid]
        if self.pc is not None:
            self.pc[st.p].insert_prompt(st.w)
        pipe = st.rec.pipeline
        if pipe == Pipeline.P_MD.value:
            st.pending_p = 1
            st.md = "waiting"
            self.D[st.d].admit(rid, st.w.input_len + st.w.max_output_tokens, self._d_admitted)
            return
        st.r = self._pick_rld(st)
        only = pipe == Pipeline.P_RLD.value
        st.pending_p = 1 if only else 2
        st.rld = "waiting"
        reserve = st.w.input_len + (st.w.max_output_tokens if only else
                                    min(st.w.max_output_tokens, self.spec.rld_eager_reserve_tokens))
        self.R[st.r].admit(rid, reserve, self._rld_admitted)
        if not only:
            st.md = "waiting"
            self.D[st.d].admit(rid, st.w.input_len + st.w.max_output_tokens, self._d_admitted)

    # ----- D / MD: KV transfer and direct start -----
    def _d_admitted(self, rid: str) -> None:
        st = self.states.get(rid) or self._tails[rid]
        st.md = "reserved"
        w = st.w
        if self.wan is None:
            nbytes = w.input_len * self.kv
            self.loop.after(self._fast_s(nbytes), self._d_kv_arrived, rid, None)
            return
        nbytes = (w.input_len - st.rec.md_hit) * self.kv
        st.rec.wan_bytes = nbytes
        st.wan_start = self.loop.now
        st.wan_tr = self.wan.start(nbytes, lambda tr, rid=rid: self._d_kv_arrived(rid, tr))

    def _d_kv_arrived(self, rid: str, tr: Optional[Transfer]) -> None:
        st = self.states.get(rid) or self._tails.get(rid)
        if st is None:
            return
        if tr is not None and self.policy is not None:
            self.bw.observe(tr.nbytes, self.loop.now - st.wan_start)
        st.wan_tr = None
        if rid in self._tails:  # RLD already finished it: MD only caches the prompt
            del self._tails[rid]
            self._p_done_one(st)
            self._md_cache_prompt(st)
            self.D[st.d].release(rid)
            return
        st.md = "kv"
        self._p_done_one(st)
        if st.rec.pipeline == Pipeline.P_MD.value:
            self._md_start_direct(st)
        else:
            self.loop.after(self.half_rtt, self._ready_at_rld, rid)

    def _md_start_direct(self, st: RequestState) -> None:
        """D/MD emits P's first token and decodes the rest."""
        now = self.loop.now
        st.rec.first_token_s = now + self.half_rtt
        st.rec.tokens_md = 1
        st.md = "running"
        rest = st.w.max_output_tokens - 1
        if rest <= 0:
            self._md_finish(st.w.request_id)
            return
        st.rec.tokens_md += rest
        self.D[st.d].join(st.w.request_id, st.w.input_len + 1, rest, self._md_finish)

    def _md_finish(self, rid: str) -> None:
        st = self.states[rid]
        st.md = "done"
        self.D[st.d].release(rid)
        if self.drc is not None:
            self.drc[st.d].insert_finished(st.w)
        self._complete(st, self.loop.now + self.half_rtt)
