"""What the emulated WAN link should look like: one frozen dataclass, the same in both directions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

BACKENDS = ("auto", "netem", "nfqueue")


@dataclass(frozen=True)
class LinkConfig:
    """One-way figures, applied to each direction of the link independently.

    delay_ms: one-way delay (RTT is about twice this).
    jitter_ms: uniform +- jitter added to each packet's delay (nfqueue backend: never reorders).
    rate_mbit: bandwidth per direction (tbf on the sender's egress); None or 0 for unlimited.
    loss_pct: independent packet loss per direction, percent.
    backend: "netem" (kernel qdisc), "nfqueue" (delay daemon), or "auto" (netem when the kernel
      has it, else nfqueue).
    """

    delay_ms: float = 20.0
    jitter_ms: float = 0.0
    rate_mbit: float | None = 100.0
    loss_pct: float = 0.0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"delay and jitter must be >= 0 (got {self.delay_ms}, {self.jitter_ms})")
        if self.jitter_ms > 0 and self.jitter_ms > self.delay_ms:
            raise ValueError(f"jitter ({self.jitter_ms} ms) larger than the delay ({self.delay_ms} ms)")
        if self.rate_mbit is not None and self.rate_mbit < 0:
            raise ValueError(f"rate must be >= 0 (got {self.rate_mbit})")
        if not 0.0 <= self.loss_pct < 100.0:
            raise ValueError(f"loss must be in [0, 100) percent (got {self.loss_pct})")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} (got {self.backend!r})")

    @property
    def rtt_ms(self) -> float:
        return 2.0 * self.delay_ms

    @property
    def shaped(self) -> bool:
        return bool(self.rate_mbit)

    @property
    def impaired(self) -> bool:
        """Whether anything beyond the rate needs emulating (delay, jitter or loss)."""
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss_pct > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LinkConfig:
        return cls(**d)

    def describe(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.shaped else "unlimited"
        jit = f" +-{self.jitter_ms:g} ms" if self.jitter_ms else ""
        loss = f", loss {self.loss_pct:g} %" if self.loss_pct else ""
        return f"{self.delay_ms:g} ms{jit} one way, {rate}{loss}"
