"""The two distributions an agentic workload is configured with: prefix-hit rate and length.

`HitHistogram` is a piecewise-uniform distribution over per-request prefix-hit rates
(hit = reused prefix tokens / input tokens). Its default mirrors docs/sim.md, "Workload": hit rates are
skewed, not steady at 90 %: about 70-80 % of requests hit above 95 %, the mean is about 90 %,
and a thin tail of low-hit requests carries most of the missed KV.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HitBucket:
    """Hit rates uniform in [lo, hi), drawn with probability `weight` (weights are normalised)."""

    lo: float
    hi: float
    weight: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.lo <= self.hi <= 1.0):
            raise ValueError(f"hit bucket bounds must satisfy 0 <= lo <= hi <= 1, got {self}")
        if self.weight < 0:
            raise ValueError(f"hit bucket weight must be >= 0, got {self}")


@dataclass(frozen=True)
class HitHistogram:
    buckets: tuple[HitBucket, ...]

    def __post_init__(self) -> None:
        if not self.buckets or sum(b.weight for b in self.buckets) <= 0:
            raise ValueError("a hit histogram needs at least one bucket with positive weight")

    @property
    def probabilities(self) -> np.ndarray:
        w = np.array([b.weight for b in self.buckets], dtype=float)
        return w / w.sum()

    def _cumulative(self) -> list[float]:
        cum = self.__dict__.get("_cum")
        if cum is None:
            cum = list(np.cumsum(self.probabilities))
            object.__setattr__(self, "_cum", cum)
        return cum

    def mean(self) -> float:
        return float(sum(p * (b.lo + b.hi) / 2 for p, b in zip(self.probabilities, self.buckets)))

    def fraction_at_least(self, x: float) -> float:
        """Probability that a draw is >= x (exact for piecewise-uniform buckets)."""
        total = 0.0
        for p, b in zip(self.probabilities, self.buckets):
            if b.hi <= b.lo:
                total += p if b.lo >= x else 0.0
            else:
                total += p * min(1.0, max(0.0, (b.hi - x) / (b.hi - b.lo)))
        return total

    def sample(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray | float:
        if n is None:  # scalar fast path (the generator draws one hit per turn)
            cum = self._cumulative()
            i = min(bisect.bisect_right(cum, rng.random()), len(self.buckets) - 1)
            b = self.buckets[i]
            return b.lo + (b.hi - b.lo) * rng.random()
        size = n
        idx = rng.choice(len(self.buckets), size=size, p=self.probabilities)
        lo = np.array([b.lo for b in self.buckets])[idx]
        hi = np.array([b.hi for b in self.buckets])[idx]
        out = lo + (hi - lo) * rng.random(size)
        return float(out[0]) if n is None else out

    # ----- constructors -----
    @classmethod
    def default(cls) -> "HitHistogram":
        """docs/sim.md, "Workload": ~71 % of requests above 95 % hit, mean ~0.907, a thin low-hit tail."""
        return cls((
            HitBucket(0.00, 0.50, 0.06),
            HitBucket(0.50, 0.90, 0.08),
            HitBucket(0.90, 0.95, 0.15),
            HitBucket(0.95, 0.99, 0.36),
            HitBucket(0.99, 1.00, 0.35),
        ))

    @classmethod
    def constant(cls, hit: float) -> "HitHistogram":
        return cls((HitBucket(hit, hit, 1.0),))

    @classmethod
    def band(cls, mean: float, width: float) -> "HitHistogram":
        """Uniform in [mean - width/2, mean + width/2], clipped to [0, 1]."""
        lo, hi = max(0.0, mean - width / 2), min(1.0, mean + width / 2)
        return cls((HitBucket(lo, hi, 1.0),))

    @classmethod
    def parse(cls, spec: str) -> "HitHistogram":
        """'lo-hi:weight,lo-hi:weight,...', e.g. '0-0.5:0.06,0.5-0.9:0.08,0.9-1:0.86'."""
        buckets = []
        for part in spec.split(","):
            rng_s, w_s = part.split(":")
            lo_s, hi_s = rng_s.split("-")
            buckets.append(HitBucket(float(lo_s), float(hi_s), float(w_s)))
        return cls(tuple(buckets))

    def to_spec(self) -> str:
        return ",".join(f"{b.lo:g}-{b.hi:g}:{b.weight:g}" for b in self.buckets)


@dataclass(frozen=True)
class LengthRange:
    """Token lengths uniform in [lo, hi] (integers)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (0 < self.lo <= self.hi):
            raise ValueError(f"length range must satisfy 0 < lo <= hi, got {self}")

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.lo, self.hi + 1))
