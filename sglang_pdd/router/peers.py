"""The router's view of its peers: which P, RLD and MD servers exist, how loaded each is, and which
one gets a request (`policy.peer_choice` scores them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlparse

from sglang_pdd.policy.peer_choice import Candidate, Choice, ChoiceConfig, PeerChooser


@dataclass
class Peer:
    url: str
    bootstrap_port: int | None = None  # P: its PD bootstrap server
    token_channel: str | None = None  # RLD: tcp://host:port MD connects to
    site: str = ""  # MD: the site (cluster) it runs in; its WAN link is that site's
    in_flight: int = 0  # this router's requests on it
    running: float = 0.0  # requests running and queued on it, from its /metrics (every router's)
    kv_usage: float = 0.0  # its KV pool's usage (0..1), from its /metrics

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
        cfg = self.choice or ChoiceConfig()
        if cfg.policy != self.policy:
            cfg = ChoiceConfig(**{**cfg.__dict__, "policy": self.policy})
        self.chooser = PeerChooser(cfg)

    def __bool__(self) -> bool:
        return bool(self.peers)

    def in_service(self, peer: Peer) -> bool:
        """Whether `peer` may get new requests."""
        return True

    def candidate(self, peer: Peer, **known) -> Candidate:
        return Candidate(peer.url, load=peer.load, kv_usage=peer.kv_usage, healthy=self.in_service(peer),
                         site=peer.site, **known)

    def choose(self, candidates: list[Candidate], input_len: int) -> tuple[Peer, Choice]:
        """The peer the chooser picks among `candidates` (one per peer, in order)."""
        if not self.peers:
            raise LookupError(f"no {self.role} server configured")
        try:
            c = self.chooser.choose(candidates, input_len)
        except LookupError:
            raise LookupError(f"no {self.role} server in service") from None
        return self.peers[c.index], c

    def pick(self) -> Peer:
        """By load alone (nothing known of caches)."""
        return self.choose([self.candidate(p) for p in self.peers], 0)[0]
