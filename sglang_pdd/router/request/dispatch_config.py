"""The dispatcher's settings (the router's flags: `router.__main__`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig


@dataclass
class DispatchConfig:
    pipeline: str = "auto"
    request_timeout_s: float = 600.0
    bandwidth_poll_s: float = 2.0  # read P's completed-transfer counters this often (0: never)
    load_poll_s: float = 1.0  # read every peer's load gauges this often (0: never; in-flight counts only)
    migration_limit: int = 1  # migrations per request after a role's failure (0: none)
    health_check_s: float = 2.0  # look at ejected peers this often: /health, then a probe generate (0: never)
    role_lock_s: float = 2.0  # with a role key: ask peers not known to be locked this often (0: never; peers.role_lock)
    # Longest wait for a role's next chunk (P: for its one reply). MD's first chunk comes only after
    # its KV landed and it took over from RLD, so its deadline must outlast the handoff timeout.
    idle_timeout_s: dict[str, float] = field(default_factory=lambda: {"prefill": 600.0, "relay": 120.0,
                                                                       "main": 180.0})
    idle_per_token_s: float = 1.0  # added to a request's idle deadlines per token its stream_interval/stop add
    migration_rate_per_s: float = 20.0  # token bucket over all migrations (0: no limit; migration.limits)
    migration_burst: int = 40
    migration_jitter_s: float = 0.1  # the most a migration waits at random before it goes
    relay_slots: int = 16  # requests one RLD takes at once before the relay placement counts it full
    relay_pool_scale: PoolScaleConfig | None = None  # the pool's scale signal (peers.relay_pool_signal); None: off
    relay_pool_window_s: int = 30  # the signal's window of placed requests

    def idle(self, role: str) -> float:
        return min(self.idle_timeout_s.get(role, self.request_timeout_s), self.request_timeout_s)
