"""DecodeRole: what sglang's decode scheduler hooks (`hooks/decode.py`) ask of a PDD decode runtime.

RelayDecode's `RelayRuntime` and MainDecode's `MainRuntime` implement it; every hook calls one method.
The lifecycle, per scheduler (attn-TP rank 0):

    start                      once, after construction
    admit                      each request sglang queued (not a retracted one)
    after_process_decode_queue each iteration, after sglang's own; publishes gauges at a bounded rate
    next_batch                 at batch selection: a batch of the role's own to run instead, or None
    on_batch_result            before sglang processes a batch's result; True: the role consumed it
    settle_idle                when sglang finds nothing to run: may the scheduler idle?
    on_abort_request           after sglang's abort_request

The role-specific methods below default to doing nothing.
"""

from __future__ import annotations

import time
from typing import Any

from sglang_pdd import metrics

PUBLISH_EVERY_S = 0.25  # the loop can spin: gauges are not free


class DecodeRole:
    """Base of the decode runtimes: no-op defaults and the rate-limited publishing of gauges."""

    role = ""  # the metrics label: "relay" or "main"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._published_at = 0.0
        self._active_at = 0.0

    # -- role-specific (no-op defaults) ----------------------------------------------------------
    def start(self) -> None:
        """Once, after construction and before the first request (warm-ups)."""

    def admit(self, req: Any) -> None:
        """A request sglang just queued. May end it (`request_errors.end_queued`); may raise, which ends it."""

    def poll(self) -> None:
        """Each iteration, after sglang's process_decode_queue: channel messages, timeouts, queues."""

    def next_batch(self, running_batch: Any) -> tuple[Any, Any]:
        """(a batch of this role's to run now, ready for sglang's run_batch, or None; the running batch)."""
        return None, running_batch

    def on_batch_result(self, batch: Any, result: Any) -> bool:
        """Before sglang processes `batch`'s result; True when this role consumed it (sglang skips it)."""
        return False

    def busy(self) -> bool:
        """Work only this role sees (the scheduler must not idle while it is)."""
        return False

    def on_abort_request(self, rid: str, message: str | None, abort_all: bool = False) -> None:
        """After sglang's abort_request ended what its own queues hold."""

    def publish(self) -> None:
        """This role's own gauges (the pool gauges are published for every role)."""

    # -- common to both roles --------------------------------------------------------------------
    def after_process_decode_queue(self) -> None:
        """`poll`, then the gauges when the last publish is older than PUBLISH_EVERY_S."""
        self.poll()
        now = self._active_at = time.monotonic()
        if now - self._published_at >= PUBLISH_EVERY_S:
            self._publish(now)

    def settle_idle(self) -> bool:
        """Whether the scheduler may idle; going idle, the gauges show the final state, not one 0.25 s old."""
        if self.busy():
            return False
        if self._published_at < self._active_at:
            self._publish(time.monotonic())
        return True

    def _publish(self, now: float) -> None:
        self._published_at = now
        metrics.publish_pool_state(self.role, self.scheduler)
        self.publish()
