"""One request's time to first token, observed once (the router's TTFT histogram)."""

from __future__ import annotations

import time

from sglang_pdd.router.request.dispatch import Outcome


class FirstToken:
    """Observes one request's time to first token (from its arrival at the router) once, on the first
    delta that carries tokens; the pipeline label is the one the dispatcher chose."""

    def __init__(self, metrics, outcome: Outcome, t0: float):
        self.metrics, self.outcome, self.t0, self.seen = metrics, outcome, t0, False

    def tick(self, delta) -> None:
        if not self.seen and delta.token_ids:
            self.seen = True
            pipe = self.outcome.pipeline.value if self.outcome.pipeline else "none"
            self.metrics.ttft.labels(pipe).observe(time.perf_counter() - self.t0)
