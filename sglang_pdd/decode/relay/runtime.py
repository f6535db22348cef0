"""RelayDecode inside sglang's decode scheduler: the token channel, and how a handoff ends a request."""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_pdd.server import idle_wait
from sglang_pdd.server import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.protocol import keys
from sglang_pdd.protocol.channel import RelayChannel
from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.decode.rank_sync import Finish, RankSync
from sglang_pdd.decode.relay.handoff import RelayHandoff, no_hold, output_logprobs
from sglang_pdd.transfer import pool_state
from sglang_pdd.policy.handoff_mode import HandoffModeConfig, HandoffModePolicy

logger = logging.getLogger(__name__)


def handoff_finish(handoff_tokens: int, mode: str = "one-shot"):
    """The finish reason of a request RLD handed over after `handoff_tokens` eager tokens (never shown
    to clients by the PDD router; a client driving the roles itself reads the count from it)."""
    from sglang.srt.managers.schedule_batch import BaseFinishReason

    class FINISH_PDD_HANDOFF(BaseFinishReason):
        def __init__(self, handoff_tokens: int, mode: str):
            super().__init__()
            self.handoff_tokens, self.mode = handoff_tokens, mode

        def to_json(self):
            return HandoffFinish(handoff_tokens=self.handoff_tokens, mode=self.mode).to_finish()

    return FINISH_PDD_HANDOFF(handoff_tokens, mode)


class RelayRuntime(DecodeRole):
    """Owns the channel and the handoff state machine of one RLD scheduler (attn-TP rank 0)."""

    role = "relay"

    def __init__(self, scheduler, cfg: PddConfig, secret: bytes, hold: Callable[[Any], bool] = no_hold):
        """`hold`: RelayHandoff's; the tests' control gives its own (controls.py), production none."""
        super().__init__(scheduler)
        host = scheduler.server_args.host or "0.0.0.0"
        clients = keys.curve_clients(cfg.token_curve)  # the MD keys its CURVE admits (None: any, or no CURVE)
        curve_key = keys.curve_key(cfg.token_curve)
        self.channel = RelayChannel(f"tcp://{host}:{cfg.token_port}", secret,
                                    vocab_size=scheduler.model_config.vocab_size, curve_key=curve_key,
                                    record=lambda reason: metrics.record_channel_rejects("relay", reason, 1),
                                    curve_clients=clients)
        policy = HandoffModePolicy(HandoffModeConfig(
            rld_busy_running=cfg.adaptive_rld_running, rld_busy_kv_usage=cfg.adaptive_rld_kv,
            md_small_batch=cfg.adaptive_md_batch))
        self.handoff = RelayHandoff(self.channel, timeout_s=cfg.handoff_timeout, policy=policy, record=_record,
                                    hold=hold)
        self.sync = RankSync(scheduler)  # TP > 1: the other ranks replay this rank's handoff finishes
        idle_wait.watch(scheduler, self.channel.sock)  # tokens from MD end an idle wait
        logger.info("sglang-pdd relay: token channel on %s%s", self.channel.address,
                    "" if not self.channel.encrypted else " (CURVE encrypted, any client key)" if clients is None
                    else f" (CURVE encrypted, {len(clients)} MainDecode keys admitted)")

    # -- RelayOps ---------------------------------------------------------------------------
    def is_decoding(self, req: Any) -> bool:
        """In the running batch, or transferred and waiting to join it (then it holds just t1)."""
        s = self.scheduler
        return any(r is req for r in s.running_batch.reqs) or any(r is req for r in s.waiting_queue)

    output_logprobs = staticmethod(output_logprobs)

    def load(self) -> tuple[int, float]:
        return len(self.scheduler.running_batch.reqs), pool_state.kv_usage(self.scheduler)

    def finish_with_handoff(self, req: Any, handoff_tokens: int, mode: str = "one-shot") -> None:
        """End the request now, between two decode steps: its stream carries exactly its first
        `handoff_tokens` tokens (on every TP rank: the other ranks replay it, rank_sync)."""
        end_with_handoff(self.scheduler, req, handoff_tokens, mode)
        self.sync.record(Finish(req.rid, handoff_tokens, mode))
        metrics.record_handoff("relay", handoff_tokens)

    # -- DecodeRole ---------------------------------------------------------------------------
    def admit(self, req: Any) -> None:
        self.handoff.track(req)

    def poll(self) -> None:
        self.handoff.poll(self)
        self.sync.flush()


def end_with_handoff(s: Any, req: Any, handoff_tokens: int, mode: str) -> None:
    """End a request RLD decodes (running, or transferred and waiting to join) with the handoff finish."""
    from sglang.srt.mem_cache.common import release_kv_cache

    waiting = any(r is req for r in s.waiting_queue)
    if waiting:
        s.waiting_queue = [r for r in s.waiting_queue if r is not req]
    req.finished_reason = handoff_finish(handoff_tokens, mode)
    s.output_streamer.stream_output([req], req.return_logprob)
    release_kv_cache(req, s.tree_cache, checkpoint=False)
    req.time_stats.set_completion_time()
    if not waiting:
        s.running_batch.filter_batch()


def _record(event: str, value: Any) -> None:
    """RelayHandoff's events on /metrics."""
    if event == "finished_locally":
        metrics.record_relay_finished("relay")
    elif event == "mode":
        metrics.record_handoff_mode("relay", *value)
    elif event == "chunk":
        metrics.record_catchup("relay", "chunks", 1)
        metrics.record_catchup("relay", "tokens", value)
    elif event == "load":
        metrics.set_handoff_policy_inputs(value.rld_running, value.rld_kv_usage, value.md_batch_size)
