"""The order of a relaying P's steps: prefill first, and one decode step of the relayed requests after each
prefill step, so a prefill waits at most one decode step for the relays and the relays never wait for an
empty prefill queue.

`next(prefill, step, last_batch)` returns (sglang's prefill plan or None, the relay's decode batch or None):
the decode batch when it runs this iteration, else the plan. sglang's chunked-prefill bookkeeping reads the
loop's last batch, which after a relay step is the relay's: it is given the last prefill batch instead.
"""

from __future__ import annotations

from typing import Any, Callable


class StepOrder:
    def __init__(self) -> None:
        self.prefill_ran_last = False
        self.last_prefill: Any = None  # the last prefill batch sglang ran
        self.last_step: Any = None  # the last decode batch of the relay's

    def next(self, prefill: Callable[[Any], Any], step: Callable[[], Any], last_batch: Any) -> tuple[Any, Any]:
        """`prefill(last_batch)`: sglang's next prefill plan (`.batch_to_run`, None when idle); `step()`: the
        relay's batch ready for a decode step, or None."""
        if last_batch is not None and last_batch is self.last_step:
            last_batch = self.last_prefill
        if self.prefill_ran_last:
            self.prefill_ran_last = False
            self.last_step = step()
            if self.last_step is not None:
                return None, self.last_step
        plan = prefill(last_batch)
        if plan.batch_to_run is not None:
            self.last_prefill, self.prefill_ran_last = plan.batch_to_run, True
            return plan, None
        self.last_step = step()
        return plan, self.last_step
