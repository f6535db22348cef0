"""P's fan-out state: the registry of fan-outs, their main lanes and the builder (prefill role only)."""

from __future__ import annotations

import functools
import logging

from sglang_pdd.server import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.protocol import keys
from sglang_pdd.protocol.request_auth import verifier_or_none
from sglang_pdd.process_state.transfer_ledger import LEDGER
from sglang_pdd.server.roles import Role
from sglang_pdd.transfer import controls
from sglang_pdd.transfer.fanout import Poll
from sglang_pdd.transfer.lanes import MAIN_PATH, RELAY_PATH, FanoutRegistry, MainLanes
from sglang_pdd.transfer.mooncake_fanout import FanoutBuilder

logger = logging.getLogger(__name__)

REGISTRY = FanoutRegistry()
LANES = MainLanes(REGISTRY, thread_context=lambda: LEDGER.path(MAIN_PATH),
                  on_relay_sessions=lambda sessions: LEDGER.tag_sessions(sessions, RELAY_PATH),
                  on_queued=lambda peer, n: metrics.set_lane_queued(MAIN_PATH, peer, n))


@functools.lru_cache(maxsize=1)
def builder() -> FanoutBuilder | None:
    """The fan-out builder on a prefill server, else None (every prefill hook then calls through)."""
    cfg = PddConfig.from_env()
    if cfg.role is not Role.PREFILL:
        return None
    secret = keys.optional_secret()
    if secret is None:
        logger.warning("sglang-pdd: this prefill has no %s: it takes any client's custom_params.pdd.main_room "
                       "(give it the secret the router holds, so that only the router's signed rooms are taken)",
                       keys.ENV_SECRET)
    return FanoutBuilder(REGISTRY, cfg.main_bootstrap_timeout, verifier=verifier_or_none(secret),
                         extra_skip_pages=controls.for_process().extra_skip_pages)


def refuses_registration(manager, room: int, status) -> bool:
    """Whether P refuses a decode's late registration of `room` (its fan-out is over or was rejected)."""
    return (status == Poll.WaitingForInput and builder() is not None and room not in manager.request_status
            and REGISTRY.refuses(room))
