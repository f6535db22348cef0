"""RelayRuntime with the test-only knobs (test_switches.TestKnobs); never in production.

`for_process` gives RLD rank 0 its runtime once, when the role starts (decode/runtime.py): the plain
`RelayRuntime` in production, `ControlledRelayRuntime` when the process's test switches are on. The
controlled runtime hands the handoff state machine its `hold` (`below_min_eager`) and marks each request
it admits, so the serving path carries no test branch.
"""

from __future__ import annotations

from typing import Any

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.relay.runtime import RelayRuntime
from sglang_pdd import test_switches
from sglang_pdd.test_switches import TestSwitches

MIN_EAGER_ATTR = "_pdd_min_eager"  # the request's `relay_min_eager`, as read when it was admitted


def for_process(scheduler, cfg: PddConfig, secret: bytes, switches: TestSwitches | None = None) -> RelayRuntime:
    """Rank 0's runtime: the plain class, or with any test switch on (the process's by default) the
    controlled one."""
    switches = switches if switches is not None else test_switches.for_process()
    if switches.controlled:
        return ControlledRelayRuntime(scheduler, cfg, secret, switches)
    return RelayRuntime(scheduler, cfg, secret)


def below_min_eager(req: Any) -> bool:
    """RelayHandoff's `hold`: no Ready is answered before the request has its `relay_min_eager` output
    tokens (a test forces the handoff's k >= it without timing; k == it when MD's Ready came first)."""
    return len(req.output_ids) < getattr(req, MIN_EAGER_ATTR, 0)


class ControlledRelayRuntime(RelayRuntime):
    """RelayRuntime under test switches: `relay_min_eager`."""

    def __init__(self, scheduler, cfg: PddConfig, secret: bytes, switches: TestSwitches):
        super().__init__(scheduler, cfg, secret, hold=below_min_eager)
        self.switches = switches

    def admit(self, req: Any) -> None:
        """`relay_min_eager`, read when a request is admitted."""
        setattr(req, MIN_EAGER_ATTR, self.switches.knobs().relay_min_eager if self.switches.on else 0)
        super().admit(req)
