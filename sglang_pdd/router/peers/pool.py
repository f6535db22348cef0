"""The router's view of its peers: which P, RLD and MD servers exist, how loaded each is, and which
one gets a request (`policy.peer_choice` scores them).

A peer out of service (`peers.health`) is skipped while another of its role is in service; a peer
refused service (`peers.role_lock`) is skipped always."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from urllib.parse import urlparse

from sglang_pdd.policy.busy_fraction import BusyFraction
from sglang_pdd.policy.peer_choice import Candidate, Choice, ChoiceConfig, PeerChooser
from sglang_pdd.router.peers.health import PeerHealth


BUSY_TAU_S = 10.0  # the busy fraction's time constant: a few of the load feed's polls, under a TTFT SLA


@dataclass
class Peer:
    url: str
    bootstrap_port: int | None = None  # P: its PD bootstrap server
    token_channel: str | None = None  # RLD, or a P that relays (--pdd-relay local): tcp://host:port MD connects to
    site: str = ""  # MD: the site (cluster) it runs in; its WAN link is that site's
    in_flight: int = 0  # this router's requests on it
    running: float = 0.0  # requests running and queued on it, from its /metrics (every router's)
    kv_usage: float = 0.0  # its KV pool's usage (0..1), from its /metrics
    waiting: float = 0.0  # requests waiting for a forward on it (`sglang:num_queue_reqs`), from its /metrics
    # its recent busy share of time, from its scheduler's idle-time counter (`peers.load_feed`)
    busy: BusyFraction = field(default_factory=lambda: BusyFraction(BUSY_TAU_S), compare=False, repr=False)
    health: PeerHealth = field(default_factory=PeerHealth, compare=False, repr=False)

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"

    @property
    def load(self) -> float:
        """What it runs: this router's count is immediate, its metrics also see other routers'."""
        return max(float(self.in_flight), self.running)


@dataclass
class PeerPool:
    """The peers of one role and the chooser that picks among them."""

    role: str
    peers: list[Peer]
    policy: str = "cache-aware"  # or least-loaded, round-robin (policy.peer_choice.POLICIES)
    choice: ChoiceConfig | None = None  # the chooser's weights (default: ChoiceConfig's)
    chooser: PeerChooser = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.chooser = PeerChooser(replace(self.choice or ChoiceConfig(), policy=self.policy))

    def __bool__(self) -> bool:
        return bool(self.peers)

    def healthy(self) -> list[Peer]:
        """The peers in service (all of them when none is: a request then still gets a try), never one
        refused service (none at all when every peer is)."""
        usable = [p for p in self.peers if not p.health.refused]
        return [p for p in usable if not p.health.out] or usable

    def out(self) -> list[Peer]:
        return [p for p in self.peers if p.health.out]

    def eligible(self, exclude: tuple[Peer, ...] = ()) -> list[Peer]:
        """The peers in service other than `exclude` (those too, where no other is in service)."""
        ok = self.healthy()
        return [p for p in ok if all(p is not x for x in exclude)] or ok

    def candidates(self, known: list[dict] | None = None, exclude: tuple[Peer, ...] = ()) -> list[Candidate]:
        """One candidate per peer, in order, with what the caller knows of each (`known[i]`)."""
        ok = {id(p) for p in self.eligible(exclude)}
        return [Candidate(p.url, load=p.load, kv_usage=p.kv_usage, healthy=id(p) in ok, site=p.site,
                          **(known[i] if known else {})) for i, p in enumerate(self.peers)]

    def choose(self, candidates: list[Candidate], input_len: int) -> tuple[Peer, Choice]:
        """The peer the chooser picks among `candidates` (one per peer, in order)."""
        if not self.peers:
            raise LookupError(f"no {self.role} server configured")
        c = self.chooser.choose(candidates, input_len)
        return self.peers[c.index], c

    def pick(self, exclude: tuple[Peer, ...] = ()) -> Peer:
        """By load alone (nothing known of caches), a peer in service other than `exclude` where
        another is in service."""
        if not self.peers:
            raise LookupError(f"no {self.role} server configured")
        return self.choose(self.candidates(exclude=exclude), 0)[0]
