"""The routing rules of `pdd-never-lose` (docs/sim.md §9): the serving policy's own decision.

The rules live in `sglang_pdd.policy.never_lose`, which the router's pipeline policy runs with
`--ttft-slo-secs`; the simulator imports them from there, so both decide alike. The simulator's
line shares its rate fairly between transfers (`Observation.fifo` False), the serving P's lane
writes in order.
"""

from sglang_pdd.policy.never_lose import (Decision, NeverLoseConfig, Observation, decide, line_has_room,  # noqa: F401
                                          predict_wan_s)
