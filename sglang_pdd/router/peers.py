"""The router's view of its peers: which P, RLD and MD servers exist and which one gets a request."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from urllib.parse import urlparse


@dataclass
class Peer:
    url: str
    bootstrap_port: int | None = None  # P: its PD bootstrap server
    token_channel: str | None = None  # RLD: tcp://host:port MD connects to
    in_flight: int = 0

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"


@dataclass
class PeerPool:
    """Round-robin or least-loaded (fewest requests in flight) among the peers of one role."""

    role: str
    peers: list[Peer]
    policy: str = "least-loaded"
    _rr: itertools.cycle = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in ("round-robin", "least-loaded"):
            raise ValueError(f"unknown peer policy {self.policy!r} (round-robin, least-loaded)")
        self._rr = itertools.cycle(range(len(self.peers))) if self.peers else iter(())

    def __bool__(self) -> bool:
        return bool(self.peers)

    def pick(self) -> Peer:
        if not self.peers:
            raise LookupError(f"no {self.role} server configured")
        if self.policy == "round-robin":
            return self.peers[next(self._rr)]
        return min(self.peers, key=lambda p: p.in_flight)
