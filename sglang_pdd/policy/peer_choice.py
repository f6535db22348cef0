"""Which server of a pool gets a request: by its cache of this prompt, its load, and its link.

One object for every pool (P, RLD, MD) and for the simulator. Each candidate comes with what the
caller knows of it: the prompt tokens its prefix cache holds (`hit`), the requests it runs
(`load`), its KV-pool usage, and, for MainDecode across a WAN, the predicted seconds its missed KV
takes to cross its site's link (`wan_s`). The cost of a candidate is

    wan_s + load_s * load + usage_s * kv_usage   (+ miss_s * missed fraction, where no WAN applies)

and the cheapest healthy one wins, as in sglang's cache-aware router and Dynamo's KV router (overlap
against load), with two guards:

* imbalance: when the busiest candidate runs more than `balance_abs` requests over the idlest and
  more than `balance_rel` times it, the least loaded wins (its cost breaks ties): a hot prefix must
  not pile every request onto one server;
* stale views: when any candidate's cache view cannot be trusted (its KV events were lost and not
  replayed), hits cannot be compared and the least loaded wins.

Candidates that tie take turns (a cold start spreads out). A dead (ejected) candidate is never
chosen. `policy="least-loaded"` and `"round-robin"` ignore
caches (the old behaviour, and the baseline of the measurements).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

POLICIES = ("cache-aware", "least-loaded", "round-robin")


@dataclass(frozen=True)
class Candidate:
    name: str
    hit: int = 0  # prompt tokens its prefix cache holds
    load: float = 0.0  # requests running (and queued) on it
    kv_usage: float = 0.0  # its KV pool's usage, 0..1
    wan_s: float | None = None  # predicted seconds for its missed KV to reach it (None: no WAN leg)
    fresh: bool = True  # its cache view can be trusted
    healthy: bool = True
    site: str = ""


@dataclass(frozen=True)
class ChoiceConfig:
    policy: str = "cache-aware"
    load_s: float = 0.01  # cost of one running request, in seconds of WAN time
    usage_s: float = 0.5  # cost of a full KV pool
    miss_s: float = 1.0  # cost of missing the whole prompt where no WAN time is predicted (P, RLD)
    balance_abs: float = 8.0
    balance_rel: float = 1.5

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown peer policy {self.policy!r} ({', '.join(POLICIES)})")
        if min(self.load_s, self.usage_s, self.miss_s, self.balance_abs) < 0 or self.balance_rel < 1:
            raise ValueError(f"invalid peer choice config {self}")


@dataclass(frozen=True)
class Choice:
    index: int
    reason: str
    costs: tuple[float, ...] = ()  # per candidate (inf: not eligible); empty when costs were not used

    @property
    def cost(self) -> float | None:
        return self.costs[self.index] if self.costs else None


@dataclass
class PeerChooser:
    cfg: ChoiceConfig = field(default_factory=ChoiceConfig)
    _rr: itertools.count = field(default_factory=itertools.count, repr=False)

    def cost(self, c: Candidate, input_len: int) -> float:
        cfg = self.cfg
        miss = 0.0 if not input_len else 1.0 - min(max(c.hit, 0), input_len) / input_len
        base = c.wan_s if c.wan_s is not None else cfg.miss_s * miss
        return base + cfg.load_s * c.load + cfg.usage_s * c.kv_usage

    def choose(self, candidates: list[Candidate], input_len: int) -> Choice:
        """Raises LookupError when there is no candidate or none is healthy."""
        live = [i for i, c in enumerate(candidates) if c.healthy]
        if not live:
            raise LookupError("no healthy server" if candidates else "no server configured")
        if len(live) == 1:
            return Choice(live[0], "the only healthy server")
        if self.cfg.policy == "round-robin":
            return Choice(live[next(self._rr) % len(live)], "round-robin")
        def by_load() -> int:
            return self._among(live, lambda i: (candidates[i].load, candidates[i].kv_usage))

        if self.cfg.policy == "least-loaded":
            return Choice(by_load(), "least-loaded")
        costs = tuple(self.cost(c, input_len) if c.healthy else float("inf") for c in candidates)
        if any(not candidates[i].fresh for i in live):
            return Choice(by_load(), "a cache view is stale: least-loaded", costs)
        loads = [candidates[i].load for i in live]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.cfg.balance_abs and hi > self.cfg.balance_rel * lo:
            idlest = [i for i in live if candidates[i].load == lo]
            best = self._among(idlest, lambda i: (costs[i],))
            return Choice(best, f"imbalanced (load {lo:g}..{hi:g}): least-loaded", costs)
        best = self._among(live, lambda i: (costs[i], candidates[i].load))
        c = candidates[best]
        return Choice(best, f"cache-aware: hit {c.hit}/{input_len}, load {c.load:g}, cost {costs[best]:.3f}", costs)

    def _among(self, indices: list[int], key) -> int:
        """The index with the smallest key; equal keys take turns (a cold start spreads out)."""
        lo = min(key(i) for i in indices)
        ties = [i for i in indices if all(abs(a - b) <= 1e-9 for a, b in zip(key(i), lo))]
        return ties[0] if len(ties) == 1 else ties[next(self._rr) % len(ties)]
