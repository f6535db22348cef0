"""Where one request goes: which P, which MD (and its site), which RLD.

MD by its cache of this prompt (the router's exact view from MD's KV events, else its record of what
it sent), its load and its site's predicted WAN time for the KV it misses; P by its own prefix cache
(the router's record of the prompts it sent each P) and load; RLD by load and KV-pool usage (RLD
is the scarce pool the adaptive handoff protects). The scoring is `policy.peer_choice`; this module
only gathers each candidate's inputs and keeps the router's cache views. It also tells the pipeline
policy which roles have a server in service (`in_service`): with every MD out, a request goes P->RLD;
and what relay capacity there is (`relay_pool`: the RLDs in service are the relay pool, their free slots
what `relay_slots` and their load leave; a P that relays, `--pdd-relay local`, hosts the relay itself:
`chose_prefill` tells the policy, `p_relays`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sglang_pdd.router.cache import CacheView
from sglang_pdd.router.cache.kv_subscriber import KvEventSource, KvEventSubscriber, main_views
from sglang_pdd.router.cache.prefix_view import PrefixView
from sglang_pdd.policy.pipeline import InService, PipelinePolicy, PrefillState
from sglang_pdd.policy.relay_placement import PoolView
from sglang_pdd.router.peers.pool import Peer, PeerPool


KV_FULL = 0.9  # an RLD whose KV pool is this used has no free relay slot


@dataclass(frozen=True)
class MainChoice:
    """The chosen MD and what the choice saw (for the response's meta_info and the metrics)."""

    peer: Peer
    index: int
    hit: int  # prompt tokens the chosen MD holds
    prompt_len: int
    site: str
    reason: str
    hits: tuple[int, ...]  # every MD's hit, in --main order
    loads: tuple[float, ...]
    wan_s: tuple[float | None, ...]

    @property
    def kind(self) -> str:
        """The reason's first word(s): cache-aware, imbalanced, stale, least-loaded, ... (a metric label)."""
        for k in ("cache-aware", "imbalanced", "stale", "least-loaded", "round-robin", "only"):
            if k in self.reason:
                return k
        return "other"

    def public(self) -> dict:
        return {"index": self.index, "site": self.site or None, "reason": self.reason, "hits": list(self.hits),
                "loads": list(self.loads)}


def _fresh(view: CacheView) -> bool:
    """An exact view that lost MD's events (not replayed) cannot be compared with the others."""
    return getattr(view, "exact", True) or getattr(view, "stale_reason", "") == "no events yet"


@dataclass
class Placement:
    prefill: PeerPool
    relay: PeerPool
    main: PeerPool
    policy: PipelinePolicy | None = None
    kv_events: dict[str, KvEventSource] | None = None
    relay_slots: int = 16  # requests one RLD takes at once before it is full (`relay_pool`)
    views: dict[str, CacheView] = field(init=False)  # MD URL -> its cache view
    kv_subscribers: list[KvEventSubscriber] = field(init=False)
    prefill_views: dict[str, PrefixView] = field(init=False)  # P URL -> the prompts sent there
    chosen_prefill: Peer | None = field(init=False, default=None)  # the last P picked (the policy's P)

    def __post_init__(self) -> None:
        self.views, self.kv_subscribers = main_views([p.url for p in self.main.peers], self.kv_events)
        self.prefill_views = {p.url: PrefixView() for p in self.prefill.peers}
        if self.policy is not None:
            self.policy.in_service = self.in_service
            self.policy.prefill_state = self.prefill_state
            self.policy.relay_pool, self.policy.p_relays = self.relay_pool, False  # until a P is chosen
            # plain PD to these crosses the WAN (the bandwidth feed learns from P->MD's transfers)
            lan = {p.host for p in self.prefill.peers + self.relay.peers}
            self.policy.links.wan_hosts = frozenset(p.host for p in self.main.peers if p.host not in lan)

    def in_service(self) -> InService:
        """Which roles have a peer in service now (`peers.health`)."""
        return InService(*(any(not p.health.out for p in pool.peers) for pool in (self.prefill, self.relay, self.main)))

    def _relays_up(self) -> list[Peer]:
        return [p for p in self.relay.peers if not p.health.out]

    def relay_pool(self) -> PoolView:
        """The RLDs in service and their free slots: `relay_slots` less each one's load, none on an RLD whose
        KV pool is nearly full."""
        up = self._relays_up()
        free = sum(max(0, self.relay_slots - math.ceil(p.load)) for p in up if p.kv_usage < KV_FULL)
        return PoolView(len(up), free)

    def relay_occupancy(self) -> float:
        """The RLDs in service: their mean use of slots or KV, whichever binds (0..1; 0 with none up)."""
        up = self._relays_up()
        return sum(min(1.0, max(p.load / self.relay_slots, p.kv_usage)) for p in up) / len(up) if up else 0.0

    def prefill_state(self) -> PrefillState | None:
        """The P picked last: the request being placed runs there (pick_prefill, then choose, with no
        await between them), so the policy reads its lane and its queue."""
        p = self.chosen_prefill
        return PrefillState(p.url, p.waiting, p.busy.fraction) if p is not None else None

    def pick_prefill(self, ids: list[int], exclude: tuple[Peer, ...] = ()) -> Peer:
        pool = self.prefill
        cands = pool.candidates([{"hit": self.prefill_views[p.url].match(ids)} for p in pool.peers], exclude)
        peer, _ = pool.choose(cands, len(ids))
        self.prefill_views[peer.url].insert(list(ids))
        self.chose_prefill(peer)
        return peer

    def chose_prefill(self, peer: Peer) -> None:
        """The request being placed runs on `peer`: the policy reads its lane and queue, and whether it can
        host the relay itself (a prefill that relays: `--prefill URL BOOTSTRAP_PORT TOKEN_PORT`)."""
        self.chosen_prefill = peer
        if self.policy is not None:
            self.policy.p_relays = peer.token_channel is not None

    def pick_main(self, ids: list[int], exclude: tuple[Peer, ...] = ()) -> MainChoice:
        pool, kvb = self.main, self.policy.cfg.kv_bytes_per_token if self.policy is not None else None
        known = []
        for p in pool.peers:
            view = self.views[p.url]
            hit = view.match(ids)
            wan = (self.policy.predict_wan_s((len(ids) - min(hit, len(ids))) * kvb, p.site)
                   if kvb is not None else None)
            known.append({"hit": hit, "wan_s": wan, "fresh": _fresh(view)})
        cands = pool.candidates(known, exclude)
        peer, c = pool.choose(cands, len(ids))
        return MainChoice(peer, c.index, cands[c.index].hit, len(ids), peer.site, c.reason, tuple(x.hit for x in cands),
                          tuple(x.load for x in cands), tuple(x.wan_s for x in cands))

    def pick_relay(self, ids: list[int], exclude: tuple[Peer, ...] = ()) -> Peer:
        pool = self.relay
        return pool.choose(pool.candidates([{"hit": len(ids)}] * len(pool.peers), exclude), len(ids))[0]

    def landed(self, md: Peer, ids: list[int]) -> None:
        """MD now caches `ids` (a prompt, or prompt + output)."""
        self.views[md.url].insert(list(ids))

