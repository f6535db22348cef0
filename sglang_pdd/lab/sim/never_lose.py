"""`pdd-never-lose`: PDD that relays only where relaying pays (issue 33 item 4, docs/sim.md §9).

The relay is co-located on P (`colocated_relay`: no RLD pool is billed) and shares P's KV pool
instead of a static share of it. MD is chosen as xdc-pd-drc chooses it. So where nothing is
relayed the deployment is cross-DC PD with DRC, request for request. The relay decodes in P's own
batches (`mixed_batch_relay`, the default) or on `colocated_relay`'s SM partition (`share`,
`interference`, only while the relay side decodes). The route follows `never_lose_rules`: queue-aware
WAN prediction, relay admission from the prefilling P's slack and headroom (the waiting a relay adds
to P's other requests, from P's recent busy fraction and the slowdown its relay causes, which the
deployment knows: `mixed_slowdown` or `prefill_factor`), odd traffic on the relay, and MD kept warm
by background prompt transfers when the line has room. The P is chosen before the route, so the route
reads the P that will host the relay. With `NeverLoseSpec.pool` (issue 46) the route is
`policy.relay_placement.decide`: P's spare capacity first, then an elastic relay pool (`relay_pool`)
whose instances join and leave with the requests at risk and are billed for the time they are up;
the run's bill (`bill_per_hour`) is then P, MD and the pool's instance-hours. `DedicatedNeverLoseCluster`
runs the same route with a relay pool of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar, Optional

from sglang_pdd.policy.busy_fraction import BusyFraction
from sglang_pdd.policy.peer_choice import Candidate
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.policy.relay_placement import Placement, PlacementConfig
from sglang_pdd.policy.relay_placement import decide as place
from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig
from sglang_pdd.lab.sim.cluster import Cluster, decode_max_batch, pool_cost
from sglang_pdd.lab.sim.colocated_relay import ColocatedCluster, ColocatedRelaySpec
from sglang_pdd.lab.sim.cost_model import Chunk
from sglang_pdd.lab.sim.lane import LineRateEstimator
from sglang_pdd.lab.sim.mixed_batch_relay import mixed_slowdown, ride_on_prefill
from sglang_pdd.lab.sim.never_lose_rules import Decision, NeverLoseConfig, Observation, decide
from sglang_pdd.lab.sim.prefill import PrefillJob
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.relay import RequestState
from sglang_pdd.lab.sim.relay_pool import ElasticRelayPool, RelayPoolSpec
from sglang_pdd.lab.sim.shared_kv_pool import pool_memory
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec
from sglang_pdd.lab.workload.request import WorkloadRequest


class NeverLoseRouting:
    """The never-lose route over a `Cluster`: mixed into the co-located and the dedicated variant."""

    def _init_routing(self, spec, raw_cost, relay_slowdown: float) -> None:
        self.line = LineRateEstimator(spec.wan.bytes_per_s * 0.5)
        c = spec.chunk_size
        self.p_tokens_per_s = c / raw_cost.prefill_step_s([Chunk(c, 0)])  # P's own rate, not slowed
        self.rules = replace(spec.rules, relay_slowdown=relay_slowdown)
        tau = spec.busy_tau_s if spec.busy_tau_s is not None else max(2 * spec.rules.wan_budget_s, 1.0)
        self.p_busy = [BusyFraction(tau) for _ in self.P]
        self.line_busy = BusyFraction(tau)
        slo = getattr(spec, "ttft_slo_s", None) or 2 * spec.rules.wan_budget_s  # the scenario's budget is half of it
        self.placement = PlacementConfig(self.rules, slo, getattr(spec, "pool_budget_s", None))
        self.pool: Optional[ElasticRelayPool] = None
        self._pool_of: dict[str, int] = {}  # request -> pool instance, placed at arrival
        self.decisions: dict[str, Decision] = {}
        self.warm_sent = 0
        self.warm_bytes = 0.0

    def _md_of(self, w: WorkloadRequest) -> int:
        """xdc-pd-drc's choice of MD (hit, load, KV usage): what changes is the route, not MD."""
        cands = [Candidate(d.name, hit=self.drc[i].peek_req(w) if self.drc is not None else 0,
                           load=d.load, kv_usage=d.kv_usage) for i, d in enumerate(self.D)]
        return self.md_chooser.choose(cands, w.input_len).index

    def observe(self, w: WorkloadRequest, md_hit: int, p: int) -> Observation:
        self.line.sample(self.wan.bytes_sent, self.wan.busy_s)
        return Observation(
            missed_bytes=(w.input_len - md_hit) * self.kv, output_tokens=w.max_output_tokens,
            lane_queued=self.wan.queued_bytes(), line_bytes_per_s=self.line.bytes_per_s,
            flow_bytes_per_s=self.bw.bytes_per_s, rtt_s=self.spec.wan.rtt_s,
            p_wait_s=self.P[p].queued_tokens / self.p_tokens_per_s,
            rld_tpot_s=self.policy.cfg.rld_tpot_s,
            p_busy_fraction=self.p_busy[p].sample(self.loop.now, self.P[p].busy_s),
            line_busy_fraction=self.line_busy.sample(self.loop.now, self.wan.busy_s))

    def _arrive(self, w: WorkloadRequest) -> None:
        if w.warmup:
            super()._arrive(w)
            return
        d = self._md_of(w)
        md_hit = self.drc[d].hit_req(w) if self.drc else 0
        p = self._pick_p_cached(w) if self.pc is not None else self._pick_p()
        p_hit = self.pc[p].hit_req(w) if self.pc is not None else w.prefix_hit_len
        obs = self.observe(w, md_hit, p)
        if self.pool is None:
            dec = decide(self.rules, obs)
        else:
            p_ttft = obs.p_wait_s + (w.input_len - p_hit) / self.p_tokens_per_s
            dec = place(self.placement, obs, p_ttft, self.pool.view())
            self.pool.note(dec.at_risk)
            if dec.placement is Placement.POOL:
                self._pool_of[w.request_id] = self.pool.place()
        self.decisions[w.request_id] = dec
        rec = RequestRecord(w.request_id, w.session_id, w.turn, self.loop.now, w.input_len,
                            w.max_output_tokens, p_hit, md_hit, dec.pipeline.value, dec.reason,
                            w.odd)
        self.records.append(rec)
        st = RequestState(w, rec)
        st.d, st.p = d, p
        self.states[w.request_id] = st
        st.job = PrefillJob(w.request_id, w.input_len, p_hit)
        self.P[p].submit(st.job)

    def _prefilled(self, rid: str) -> None:
        st = self.states[rid]
        super()._prefilled(rid)
        dec = self.decisions.pop(rid, None)
        if dec is not None and dec.pipeline is Pipeline.P_RLD and dec.warm_md:
            self._warm(st)

    def _warm(self, st: RequestState) -> None:
        """Send the prompt's missed KV to MD in the background; MD caches it on arrival."""
        nbytes = (st.w.input_len - st.rec.md_hit) * self.kv
        self.warm_sent += 1
        self.warm_bytes += nbytes
        w, d = st.w, st.d
        self.wan.start(nbytes, lambda tr: self.drc[d].insert_prompt(w))


class NeverLoseCluster(NeverLoseRouting, ColocatedCluster):
    """The relay co-located on P, sharing P's KV pool. `relay_batching` "mixed": it decodes in P's own
    batches, prefill first (`mixed_batch_relay`; the headroom rule reads `mixed_slowdown`);
    "partition": an SM partition, every prefill step `prefill_factor` as long while it decodes.
    With `spec.pool`, the elastic relay pool's instances follow the co-located relays in `R`."""

    def __init__(self, spec, model, eff, *a, **kw):
        super().__init__(spec, model, eff, *a, **kw)
        raw = self.P[0].cost.cost  # P's own cost model, under the partition's slowdown
        for p, r in zip(self.P, self.R):  # undo the static split: the pool is shared
            pool_memory(p, r, p.capacity + r.capacity)
            if spec.relay_batching == "mixed":
                ride_on_prefill(p, r, p.cost.cost, self.loop)
        slowdown = (spec.prefill_factor if spec.relay_batching == "partition"
                    else mixed_slowdown(raw, spec.chunk_size, self.context_tokens))
        self._init_routing(spec, raw, slowdown)
        if spec.pool is not None:
            self._add_pool(spec, model, eff, kw.get("tpot_target_s", 0.1))

    def _add_pool(self, spec, model, eff, tpot_target_s: float) -> None:
        shape = spec.pool_instance
        cost = pool_cost(model, shape, eff)
        batch = decode_max_batch(cost, shape, self.context_tokens, tpot_target_s)
        inst = [DecodeInstance(self.loop, cost, f"E{j}", batch) for j in range(spec.pool.max_instances)]
        self.R.extend(inst)
        scale = PoolScaleConfig(shape.price_per_hour, spec.price_per_hour, spec.pool.min_instances,
                                spec.pool.max_instances)
        self.pool = ElasticRelayPool(self.loop, inst, spec.pool, scale)

    def _pick_rld(self, st) -> int:
        j = self._pool_of.pop(st.w.request_id, None)
        if j is None:
            return st.p
        self.pool.reserved(j)
        return len(self.P) + j

    def bill_per_hour(self, start_s: float, end_s: float) -> float:
        """The run's mean bill: P and MD, and the pool's instance-hours over the run's span."""
        base = self.spec.price_per_hour
        if self.pool is None or end_s <= start_s:
            return base
        up = self.pool.instance_seconds(start_s, end_s) / (end_s - start_s)
        return base + up * self.spec.pool_instance.price_per_hour


class DedicatedNeverLoseCluster(NeverLoseRouting, Cluster):
    """The relay on a pool of its own (billed): relaying does not slow P (slowdown 1)."""

    def __init__(self, spec, model, eff, *a, **kw):
        super().__init__(spec, model, eff, *a, **kw)
        self._init_routing(spec, self.P[0].cost, 1.0)


@dataclass(frozen=True)
class NeverLoseSpec(ColocatedRelaySpec):
    rules: NeverLoseConfig = field(default_factory=NeverLoseConfig)
    # P's busy fraction averages over this (s); None: twice the WAN budget, i.e. the TTFT SLA when the
    # budget is half of it (the horizon over which a slowed P costs other requests their SLA)
    busy_tau_s: Optional[float] = None
    relay_batching: str = "mixed"  # or "partition" (§7's SM split)
    pool: Optional[RelayPoolSpec] = None  # the elastic relay pool (issue 46); None: relay on P only
    pool_budget_s: Optional[float] = None  # a pool instance that is up relays a WAN time over this (None: 2 RTT)
    ttft_slo_s: Optional[float] = None  # the TTFT SLA the pool's at-risk count reads (None: twice the WAN budget)

    cluster_class: ClassVar[type] = NeverLoseCluster

    @property
    def pool_instance(self) -> PoolSpec:
        """One pool instance: P's chip, `pool.chips_per_instance` of them (P's count if None)."""
        p = self.prefill
        n = self.pool.chips_per_instance if self.pool is not None else None
        return PoolSpec(p.chip, 1, n or p.chips_per_instance)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.relay_batching not in ("mixed", "partition"):
            raise ValueError(f"{self.name}: relay_batching must be mixed or partition, got {self.relay_batching!r}")


@dataclass(frozen=True)
class DedicatedNeverLoseSpec(SystemSpec):
    rules: NeverLoseConfig = field(default_factory=NeverLoseConfig)
    busy_tau_s: Optional[float] = None

    cluster_class: ClassVar[type] = DedicatedNeverLoseCluster


def never_lose_system(base: SystemSpec, name: str = "pdd-never-lose",
                      rules: NeverLoseConfig = NeverLoseConfig(), **kw) -> NeverLoseSpec:
    """`base` (a PDD spec: its pools, line and handoff) with the relay co-located on P and the
    never-lose routing."""
    args = {f.name: getattr(base, f.name) for f in fields(SystemSpec)}
    p = base.prefill
    args.update(name=name, relay=PoolSpec(p.chip, p.instances, p.chips_per_instance))
    return NeverLoseSpec(**args, rules=rules, **kw)


def dedicated_never_lose_system(base: SystemSpec, name: str = "pdd-never-lose-dedicated",
                                rules: NeverLoseConfig = NeverLoseConfig(), **kw) -> DedicatedNeverLoseSpec:
    """`base` (a PDD spec with its RLD pool, billed) with the never-lose routing."""
    args = {f.name: getattr(base, f.name) for f in fields(SystemSpec)}
    args.update(name=name)
    return DedicatedNeverLoseSpec(**args, rules=rules, **kw)
