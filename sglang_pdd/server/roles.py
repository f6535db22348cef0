"""The three PDD roles and how each maps onto an upstream sglang PD server."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    PREFILL = "prefill"  # P: cluster A, runs prefill, fans the KV out to RLD and MD
    RELAY = "relay"  # RLD: cluster A next to P, decodes at once, hands over by token IDs
    MAIN = "main"  # MD: cluster B, decode radix cache, takes over via one EXTEND step

    @property
    def disaggregation_mode(self) -> str:
        """The upstream `--disaggregation-mode` this role runs on."""
        return "prefill" if self is Role.PREFILL else "decode"

    @property
    def needs_decode_radix_cache(self) -> bool:
        """MD's cache is what keeps WAN bytes low; the handoff relies on it."""
        return self is Role.MAIN


ROLE_CHOICES = tuple(r.value for r in Role)
