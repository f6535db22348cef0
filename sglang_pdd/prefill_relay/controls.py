"""LocalRelay with the test-only knobs (test_switches.TestKnobs); never in production.

`for_process` gives a prefill that relays its `LocalRelay` once, when it starts (prefill_relay/runtime.py): the
plain class in production, `ControlledLocalRelay` when the process's test switches are on. The controlled
relay holds each Ready until the request has `relay_min_eager` tokens, as RelayDecode's does
(decode/relay/controls.py), so a test forces a handoff with k >= it without timing, and parks every
relayed request with `local_relay_park`, as a P short of KV does.
"""

from __future__ import annotations

from typing import Any

from sglang_pdd import test_switches
from sglang_pdd.config import PddConfig
from sglang_pdd.decode.relay.controls import MIN_EAGER_ATTR, below_min_eager
from sglang_pdd.prefill_relay.local_relay import LocalRelay
from sglang_pdd.test_switches import TestSwitches


def for_process(scheduler: Any, cfg: PddConfig, secret: bytes, switches: TestSwitches | None = None) -> LocalRelay:
    switches = switches if switches is not None else test_switches.for_process()
    if switches.controlled:
        return ControlledLocalRelay(scheduler, cfg, secret, switches)
    return LocalRelay(scheduler, cfg, secret)


class ControlledLocalRelay(LocalRelay):
    def __init__(self, scheduler: Any, cfg: PddConfig, secret: bytes, switches: TestSwitches):
        super().__init__(scheduler, cfg, secret, hold=below_min_eager)
        self.switches = switches

    def take_prefilled(self, reqs: list) -> None:
        n = self.switches.knobs().relay_min_eager if self.switches.on else 0
        for req in reqs:
            setattr(req, MIN_EAGER_ATTR, n)
        super().take_prefilled(reqs)
        for req in self.batch.parked:  # it decodes nothing: held, it would never be handed over
            setattr(req, MIN_EAGER_ATTR, 0)

    def admits(self) -> bool:
        """`local_relay_park`: no KV for relays, whatever the pool holds."""
        return not (self.switches.on and self.switches.knobs().local_relay_park) and super().admits()
