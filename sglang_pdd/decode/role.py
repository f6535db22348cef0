"""DecodeRole: what sglang's decode scheduler asks of a PDD decode runtime.

RelayDecode's `RelayRuntime` and MainDecode's `MainRuntime` implement it. sglang calls it through the
decode scheduler hooks (`hooks/decode.py`, stock sglang) or through its decode scheduler extension
(`extension.py`, sglang with patch 0003); either entry calls one method per call site.
The lifecycle, per scheduler (attn-TP rank 0):

    start                      once, after construction
    take_request               each request sglang queued (not a retracted one): `admit`, guarded
    after_process_decode_queue each iteration, after sglang's own; publishes gauges at a bounded rate
    next_batch                 at batch selection: a batch of the role's own to run instead, or None
    on_batch_result            before sglang processes a batch's result; True: the role consumed it
    settle_idle                when sglang finds nothing to run: may the scheduler idle?
    after_abort_request        after sglang's abort_request: `on_abort_request` with the AbortReq's fields

The role-specific methods below default to doing nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sglang_pdd.server import metrics
from sglang_pdd.decode.request_errors import end_queued
from sglang_pdd.transfer import pool_state

logger = logging.getLogger(__name__)

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
    def take_request(self, req: Any) -> None:
        """`admit`; whatever it raises is this request's problem: it ends with a 500, the scheduler goes on."""
        try:
            self.admit(req)
        except Exception as e:
            logger.exception("request %s: sglang-pdd could not take it", req.rid)
            end_queued(req, f"pdd: internal error taking the request: {type(e).__name__}: {e}", status_code=500)

    def after_process_decode_queue(self) -> None:
        """`poll`, then the gauges when the last publish is older than PUBLISH_EVERY_S."""
        self.poll()
        now = self._active_at = time.monotonic()
        if now - self._published_at >= PUBLISH_EVERY_S:
            self._publish(now)

    def after_abort_request(self, recv_req: Any) -> None:
        """sglang's AbortReq, after sglang ended what its own queues hold: the role ends what it holds."""
        self.on_abort_request(recv_req.rid, getattr(recv_req, "abort_message", None),
                              abort_all=bool(getattr(recv_req, "abort_all", False)))

    def settle_idle(self) -> bool:
        """Whether the scheduler may idle; going idle, the gauges show the final state, not one 0.25 s old."""
        if self.busy():
            return False
        if self._published_at < self._active_at:
            self._publish(time.monotonic())
        return True

    def _publish(self, now: float) -> None:
        self._published_at = now
        metrics.publish_pool_state(self.role, pool_state.pool_counts(self.scheduler))
        self.publish()
