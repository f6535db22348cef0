"""The router's view of its peers: which P, RLD and MD servers exist and which one gets a request.

A peer out of service (`peer_health`) is skipped while another of its role is in service."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from urllib.parse import urlparse

from sglang_pdd.router.peer_health import PeerHealth


@dataclass
class Peer:
    url: str
    bootstrap_port: int | None = None  # P: its PD bootstrap server
    token_channel: str | None = None  # RLD: tcp://host:port MD connects to
    in_flight: int = 0
    health: PeerHealth = field(default_factory=PeerHealth, compare=False, repr=False)

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

    def healthy(self) -> list[Peer]:
        """The peers in service (all of them when none is: a request then still gets a try)."""
        return [p for p in self.peers if not p.health.out] or list(self.peers)

    def out(self) -> list[Peer]:
        return [p for p in self.peers if p.health.out]

    def pick(self, exclude: tuple[Peer, ...] = ()) -> Peer:
        """A peer in service, other than those in `exclude` where another is in service."""
        if not self.peers:
            raise LookupError(f"no {self.role} server configured")
        ok = self.healthy()
        ok = [p for p in ok if all(p is not x for x in exclude)] or ok
        if self.policy == "round-robin":
            ids = {id(p) for p in ok}
            for _ in range(len(self.peers)):
                p = self.peers[next(self._rr)]
                if id(p) in ids:
                    return p
        return min(ok, key=lambda p: p.in_flight)
