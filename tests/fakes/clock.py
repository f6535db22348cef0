"""A clock the test sets: stands for `time.monotonic` / `time.time` (call it) and `time.sleep` (`sleep`
advances it and records the nap)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t
        self.naps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.naps.append(s)
        self.t += s
