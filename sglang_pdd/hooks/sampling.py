"""SamplingBatchInfo: per-request seeds for sglang's position-hashed sampler (see seeded_sampling)."""

from __future__ import annotations

import functools

from sglang_pdd.config import PddConfig
from sglang_pdd.server.seeded_sampling import attach_seeds


@functools.lru_cache(maxsize=1)
def _on() -> bool:
    return PddConfig.from_env().honours_seeds


def after_from_schedule_batch(info, _cls, batch, *a, **kw):
    if _on():
        attach_seeds(info, batch.reqs, batch.device)
    return info
