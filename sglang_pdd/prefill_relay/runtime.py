"""The LocalRelay of a prefill scheduler started with `--pdd-relay local`, created on first use; None elsewhere."""

from __future__ import annotations

from typing import Any

from sglang_pdd.config import PddConfig

_UNSET = object()


def relay(scheduler: Any):
    """The scheduler's LocalRelay (prefill_relay/local_relay.py), or None: not a prefill that relays."""
    rt = getattr(scheduler, "_pdd_local_relay", _UNSET)
    if rt is not _UNSET:
        return rt
    rt = None
    cfg = PddConfig.from_env()
    if cfg.relays_locally:
        from sglang_pdd.prefill_relay import controls
        from sglang_pdd.protocol import keys

        rt = controls.for_process(scheduler, cfg, keys.secret())
    scheduler._pdd_local_relay = rt
    return rt
