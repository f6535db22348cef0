"""The decode runtime of an sglang scheduler: RelayDecode's `RelayRuntime` or MainDecode's `MainRuntime`.

`runtime(scheduler)` creates and starts it on first use (attention-TP rank 0 of a relay or main
server; on its other TP ranks a follower that replays rank 0's decisions, rank_sync.py; None elsewhere) and keeps it on the scheduler. sglang reaches it through one of two entries,
chosen at load (plugin.CAPABILITIES): on stock sglang the six decode scheduler hooks
(hooks/decode.py) call it on first use; on sglang with patch 0003 the decode scheduler extension
(extension.py) is created with it when sglang builds the scheduler.

Rank 0's class is chosen once, when the role starts, by its role's control module (relay/controls.py,
main/controls.py, the only decode modules that read the test switches): with the process's test
switches on, the subclass that carries the tests' negative controls and knobs; in production the plain
class, whose serving path has no test branch.
"""

from __future__ import annotations

import logging

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.protocol import keys
from sglang_pdd.server.roles import Role

logger = logging.getLogger(__name__)

_UNSET = object()


def runtime(scheduler) -> DecodeRole | None:
    """The scheduler's RelayRuntime / MainRuntime, created and started on first use; None when inert."""
    rt = getattr(scheduler, "_pdd_runtime", _UNSET)
    if rt is not _UNSET:
        return rt
    rt = None
    cfg = PddConfig.from_env()
    if cfg.role in (Role.RELAY, Role.MAIN) and attn_tp_rank(scheduler) != 0:
        rt = _follower(scheduler, cfg)
    elif cfg.role in (Role.RELAY, Role.MAIN):
        rt = _leader(scheduler, cfg)
        rt.start()
    scheduler._pdd_runtime = rt
    return rt


def _leader(scheduler, cfg: PddConfig) -> DecodeRole:
    """Rank 0's runtime, from its role's control module: the plain class, or with any test switch on its
    subclass with the controls."""
    secret = keys.secret()
    if cfg.role is Role.RELAY:
        from sglang_pdd.decode.relay import controls as relay_controls

        return relay_controls.for_process(scheduler, cfg, secret)
    from sglang_pdd.decode.main import controls as main_controls  # torch and the kernels only in an MD process

    return main_controls.for_process(scheduler, cfg, secret)


def _follower(scheduler, cfg: PddConfig) -> DecodeRole | None:
    """A TP rank other than 0 replays rank 0's decisions (rank_sync.py); None with TP 1."""
    from sglang_pdd.decode.rank_sync import RankSync

    sync = RankSync(scheduler)
    if not sync.active:
        return None
    logger.info("sglang-pdd %s: TP rank %d replays rank 0's decisions", cfg.role.value, attn_tp_rank(scheduler))
    if cfg.role is Role.RELAY:
        from sglang_pdd.decode.relay.follower import RelayFollower

        return RelayFollower(scheduler, sync)
    from sglang_pdd.decode.main.follower import MainFollower

    return MainFollower(scheduler, sync)


def attn_tp_rank(scheduler) -> int:
    """The scheduler's attention-TP rank: sglang keeps it in its parallel context, not on the scheduler."""
    rank = getattr(scheduler, "attn_tp_rank", None)
    if rank is not None:
        return int(rank)
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().attn_tp_rank)
    except Exception:  # no parallel context (a scheduler stand-in): one rank
        return 0


def current(scheduler) -> DecodeRole | None:
    """The runtime if it exists already (never creates one)."""
    return getattr(scheduler, "_pdd_runtime", None)
