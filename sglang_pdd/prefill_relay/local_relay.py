"""LocalRelay: a prefill's relay (`--pdd-relay local`), RelayDecode's job done by P in P's own scheduler.

For a request the router relays to P (`custom_params.pdd.relay_here`, signed: `protocol.request`), P runs
the prefill and sends MD the KV MD misses over the request's own room, as for P->MD; then, instead of
freeing the request, it keeps it (`take_prefilled`): its first token goes to the client at once and it
decodes in `RelayBatch`, one decode step after each prefill step (`StepOrder`: a prefill waits at most
one decode step for the relay, and a relay never waits for an empty prefill queue). MD talks to P's token
channel as to RLD's: `RelayHandoff`, the same state machine, answers its `Ready` with the token IDs so far
(one-shot or catch-up) and ends P's copy with the handoff finish. The request's KV stays P's until both its
relay ended and its transfer to MD is over (`HeldRows`); the transfer is polled here, not by sglang's
inflight queue, which would free the rows and end the request when it lands.

Admission (`admits`): a request relays only while P's free KV (free and evictable) covers what the relays
could write in the next `HORIZON` steps, twice over; otherwise it is parked at once: it decodes nothing and
hands MD its first token (k = 1), which is P->MD with one more EXTEND token. A step that no longer fits parks
the whole relay batch the same way (`RelayBatch.step`).

TP 1, the non-overlap prefill loop: the only configuration this is proven on (server.supported refuses the
rest at start-up).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.relay.handoff import RelayHandoff, no_hold, output_logprobs
from sglang_pdd.decode.relay.runtime import handoff_finish
from sglang_pdd.policy.handoff_mode import HandoffModeConfig, HandoffModePolicy
from sglang_pdd.prefill_relay.held_rows import HeldRows
from sglang_pdd.prefill_relay.relay_batch import RelayBatch
from sglang_pdd.prefill_relay.step_order import StepOrder
from sglang_pdd.protocol import keys
from sglang_pdd.protocol.channel import RelayChannel
from sglang_pdd.protocol.request import RequestParamsError, parse
from sglang_pdd.protocol.request_auth import ParamsVerifier
from sglang_pdd.server import idle_wait, metrics
from sglang_pdd.transfer import pool_state

logger = logging.getLogger(__name__)

ROLE = "prefill"  # the metrics label of what P records as a relay
HORIZON = 64  # decode steps of KV a relay reserves when it is admitted
MAX_NEW_TOKENS_ATTR = "_pdd_max_new_tokens"  # the request's own, kept before sglang's prefill queue sets 1


def keep_max_new_tokens(req: Any) -> None:
    """Before sglang's prefill queue sets `max_new_tokens` to 1: the request's own, for P's relay."""
    setattr(req, MAX_NEW_TOKENS_ATTR, req.sampling_params.max_new_tokens)


class LocalRelay:
    def __init__(self, scheduler: Any, cfg: PddConfig, secret: bytes, hold: Callable[[Any], bool] = no_hold):
        self.s = scheduler
        host = scheduler.server_args.host or "0.0.0.0"
        clients = keys.curve_clients(cfg.token_curve)
        self.channel = RelayChannel(f"tcp://{host}:{cfg.token_port}", secret,
                                    vocab_size=scheduler.model_config.vocab_size,
                                    curve_key=keys.curve_key(cfg.token_curve),
                                    record=lambda reason: metrics.record_channel_rejects(ROLE, reason, 1),
                                    curve_clients=clients)
        policy = HandoffModePolicy(HandoffModeConfig(
            rld_busy_running=cfg.adaptive_rld_running, rld_busy_kv_usage=cfg.adaptive_rld_kv,
            md_small_batch=cfg.adaptive_md_batch))
        self.handoff = RelayHandoff(self.channel, timeout_s=cfg.handoff_timeout, policy=policy, hold=hold)
        self.verifier = ParamsVerifier(secret)
        self.batch = RelayBatch(scheduler)
        self.relayed: dict[str, Any] = {}  # rid -> request P took over after its prefill, until it ends
        self.transfers: dict[str, Any] = {}  # rid -> relayed request whose KV transfer to MD is not over
        self.rows = HeldRows(scheduler.tree_cache, pending=self.transfers.__contains__)
        self.order = StepOrder()
        idle_wait.watch(scheduler, self.channel.sock)  # MD's Ready ends an idle wait
        logger.info("sglang-pdd prefill: relays locally, token channel on %s", self.channel.address)

    # -- the scheduler's choice of batch --------------------------------------------------------
    def next_plan(self, original: Callable, running_batch: Any, last_batch: Any, *a, **kw) -> Any:
        """sglang's next prefill plan, or this relay's decode step (`StepOrder`: prefill first, one step between two)."""
        from sglang.srt.managers.schedule_batch import NextBatchPlan

        self.poll()
        plan, step = self.order.next(lambda last: original(self.s, running_batch, last, *a, **kw), self.batch.step,
                                     last_batch)
        if step is None:
            return plan
        return NextBatchPlan(batch_to_run=step, running_batch=running_batch if plan is None else plan.running_batch)

    # -- requests in -------------------------------------------------------------------------
    def take_prefilled(self, reqs: list) -> None:
        """Requests whose prefill just finished (now in sglang's inflight queue): the relayed ones stay."""
        from sglang.srt.mem_cache.common import release_kv_cache

        joined = []
        for req in reqs:
            if req.finished() or req.pending_bootstrap or not self._relayed(req):
                continue  # (prefilled before MD's handshake: refused at start-up, server.supported)
            self.relayed[req.rid] = req
            self.transfers[req.rid] = req
            self.handoff.track(req)
            # sglang's prefill queue set max_new_tokens to 1 (PrefillBootstrapQueue._process_req); P decodes it now
            req.sampling_params.max_new_tokens = getattr(req, MAX_NEW_TOKENS_ATTR, 1)
            req.update_finish_state(1)  # its first token may end it (EOS, a stop, max_new_tokens 1)
            if req.finished():
                release_kv_cache(req, self.s.tree_cache, checkpoint=False)  # held until its transfer is over
                req.time_stats.set_completion_time()
                metrics.record_local_relay("finished_at_prefill")
            elif self.admits():
                joined.append(req)
                metrics.record_local_relay("decoding")
            else:
                self.batch.parked.append(req)
                metrics.record_local_relay("parked")
        if joined:
            self.batch.join(joined)
        taken = [r for r in reqs if r.rid in self.relayed]
        if taken:  # the first token now, not with the second
            self.s.output_streamer.stream_output(taken, any(r.return_logprob for r in taken))

    def _relayed(self, req: Any) -> bool:
        try:
            params = parse(req.sampling_params.custom_params)
        except RequestParamsError:
            return False  # the fan-out builder refused it already
        if params is None or not params.relay_here:
            return False
        try:
            self.verifier.check(params, req.bootstrap_room)
        except RequestParamsError as e:
            logger.warning("request %s: not relayed here (%s): served P->MD", req.rid, e)
            metrics.record_local_relay("refused_unsigned")
            return False
        return True

    def admits(self) -> bool:
        """Whether P's free KV covers the relays' next HORIZON steps twice over, this one's included."""
        return pool_state.free_kv(self.s) >= 2 * HORIZON * (self.batch.decoding() + 1)

    # -- sglang's inflight queue ------------------------------------------------------------
    def poll_transfers(self, original: Callable, *a, **kw) -> Any:
        """sglang polls the other requests; the relayed ones' senders are polled here (their success
        does not end them or free their rows)."""
        s = self.s
        queue = s.disagg_prefill_inflight_queue
        mine = [r for r in queue if r.rid in self.transfers]
        if mine:
            s.disagg_prefill_inflight_queue = [r for r in queue if r.rid not in self.transfers]
        done = original(s, *a, **kw)
        for req in mine:
            if not self._poll_transfer(req):
                s.disagg_prefill_inflight_queue.append(req)
        return done

    def _poll_transfer(self, req: Any) -> bool:
        """True once the request's transfer is over (landed or failed)."""
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer

        s = self.s
        poll = req.disagg_kv_sender.poll()
        if poll not in (KVPoll.Success, KVPoll.Failed):
            return False
        if poll == KVPoll.Failed:
            logger.warning("request %s: its KV transfer to MD failed; P relays it to its end", req.rid)
            metrics.record_local_relay("transfer_failed")
        req.disagg_kv_sender.clear()
        maybe_release_metadata_buffer(req, s.req_to_metadata_buffer_idx_allocator)
        self.transfers.pop(req.rid, None)
        if self.rows.release(req):
            self._forget(req)
        return True

    # -- the token channel and the handoff -----------------------------------------------------
    def poll(self) -> None:
        self.handoff.poll(self)
        for req in [r for r in self.batch.parked if r.finished()]:
            self.batch.drop_parked(req)
        for rid, req in list(self.relayed.items()):
            if req.finished() and rid not in self.transfers and rid not in self.rows.held:
                self._forget(req)

    def is_decoding(self, req: Any) -> bool:
        return self.batch.has(req)

    output_logprobs = staticmethod(output_logprobs)

    def load(self) -> tuple[int, float]:
        return self.batch.decoding(), pool_state.kv_usage(self.s)

    def finish_with_handoff(self, req: Any, handoff_tokens: int, mode: str = "one-shot") -> None:
        """End P's copy between two steps: its stream carries exactly its first `handoff_tokens` tokens."""
        self._end_now(req, handoff_finish(handoff_tokens, mode))
        metrics.record_handoff(ROLE, handoff_tokens)

    def on_abort(self, rid: str, abort_all: bool = False) -> None:
        """sglang's abort reached P: a relayed request ends at its next step (parked: now)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        for req in list(self.relayed.values()):
            if req.finished() or not (abort_all or req.rid.startswith(rid)):
                continue
            metrics.record_local_relay("aborted")
            if any(r is req for r in self.batch.parked):
                self._end_now(req, FINISH_ABORT())
            else:
                req.to_finish = FINISH_ABORT()

    def _end_now(self, req: Any, reason: Any) -> None:
        """End P's copy between two steps with `reason`: streamed, its row released (held while its transfer
        is not over); a decoding one leaves the batch at its next step."""
        from sglang.srt.mem_cache.common import release_kv_cache

        req.finished_reason = reason
        self.s.output_streamer.stream_output([req], req.return_logprob)
        release_kv_cache(req, self.s.tree_cache, checkpoint=False)
        req.time_stats.set_completion_time()
        self.batch.drop_parked(req)

    def _forget(self, req: Any) -> None:
        self.relayed.pop(req.rid, None)

    # -- sglang's idle check and leak checks ------------------------------------------------------
    def holds(self) -> bool:
        """Rows or requests of the relay's: the scheduler is not idle (sglang's idle pool check would take a
        parked request's or a held row for a leak)."""
        return bool(self.relayed) or len(self.batch) > 0 or len(self.rows) > 0

    def state(self) -> dict:
        """What this relay holds (all 0 when P is idle): P's `/get_server_info`, transfer.pool_state."""
        return {"relayed": len(self.relayed), "decoding": self.batch.decoding(), "parked": len(self.batch.parked),
                "held_rows": len(self.rows), "transfers": len(self.transfers)}
