"""How fast requests may migrate: a random jitter before each migration, a token bucket over all.

When an MD dies, every stream it served fails at once, and each migration re-prefills its prompt plus
what was sent on P: a burst of long prefills that stalls P for everyone. Each migration first waits a
random delay in [0, `jitter_s`] (spreading the burst), and takes a token from a bucket of `burst`
tokens refilled at `rate_per_s`; with the bucket empty the request is not migrated and fails with a
503 that names the limit (the client may retry later; the router does not queue the re-prefills).
`rate_per_s` 0: no limit. The clock, the random source and the sleep are injectable (tests).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable


@dataclass
class MigrationLimits:
    rate_per_s: float = 20.0  # migrations per second, the router over (0: no limit)
    burst: int = 40  # migrations at once after a quiet spell
    jitter_s: float = 0.1  # the most a migration waits before it goes (0: none)
    now: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    _tokens: float = field(init=False, default=0.0)
    _at: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or self.burst < 1 or self.jitter_s < 0:
            raise ValueError("--migration-rate must be >= 0, --migration-burst >= 1, --migration-jitter-s >= 0")
        self._tokens = float(self.burst)

    def take(self) -> bool:
        """One migration: True when the bucket had a token for it (always, without a rate limit)."""
        if self.rate_per_s == 0:
            return True
        t = self.now()
        if self._at is not None:
            self._tokens = min(float(self.burst), self._tokens + (t - self._at) * self.rate_per_s)
        self._at = t
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def refusal(self) -> str:
        return (f"the router's migration rate limit (--migration-rate {self.rate_per_s:g}/s, --migration-burst "
                f"{self.burst}) is reached")

    async def wait(self) -> float:
        """The jitter before one migration; returns the delay it waited."""
        delay = self.rng.uniform(0.0, self.jitter_s) if self.jitter_s > 0 else 0.0
        if delay > 0:
            await self.sleep(delay)
        return delay
