"""RelayRuntime with the test-only knobs (test_switches.TestKnobs); never in production.

decode/runtime.py builds `ControlledRelayRuntime` instead of `RelayRuntime` once, at construction, and
only when the process's test switches are on; it overrides the hook `RelayRuntime` calls with its plain
value, so the serving path carries no test branch.
"""

from __future__ import annotations

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.relay.runtime import RelayRuntime
from sglang_pdd.test_switches import TestSwitches


class ControlledRelayRuntime(RelayRuntime):
    """RelayRuntime under test switches: `relay_min_eager`."""

    def __init__(self, scheduler, cfg: PddConfig, secret: bytes, switches: TestSwitches):
        super().__init__(scheduler, cfg, secret)
        self.switches = switches

    def _min_eager(self) -> int:
        """`relay_min_eager`, read when a request is admitted (a test forces k without timing)."""
        return self.switches.knobs().relay_min_eager if self.switches.on else 0
