"""MainDecode inside sglang's decode scheduler: divert relayed requests, talk to RLD, run the EXTEND."""

from __future__ import annotations

import logging
from typing import Any

from sglang_pdd.server import idle_wait
from sglang_pdd.server import metrics
from sglang_pdd.config import PddConfig
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.decode.main import extend_batch
from sglang_pdd.decode.main.handoff import Abort, MainHandoff
from sglang_pdd.decode.main.handoff_attention import ATTENTION, HandoffAttention
from sglang_pdd.protocol import keys
from sglang_pdd.protocol.channel import MainChannel
from sglang_pdd.protocol.request import RequestParamsError, parse
from sglang_pdd.protocol.request_auth import ParamsVerifier
from sglang_pdd.decode.rank_sync import Abort as RankAbort
from sglang_pdd.decode.rank_sync import Extend, ExtendItem, Hold, RankSync, Refuse, Round
from sglang_pdd.decode.request_errors import end_queued
from sglang_pdd.transfer import pool_state

logger = logging.getLogger(__name__)


class MainRuntime(DecodeRole):
    """Owns the channels, the handoff state machine and the handoff EXTEND of one MD scheduler."""

    role = "main"

    def __init__(self, scheduler, cfg: PddConfig, secret: bytes, attention: HandoffAttention = ATTENTION):
        super().__init__(scheduler)
        client_key = keys.curve_client_key(cfg.token_curve)  # its public key is on the relays' allowlists
        curve_key = keys.curve_key(cfg.token_curve)  # the relays' public key
        self.channel = MainChannel(secret, vocab_size=scheduler.model_config.vocab_size, curve_key=curve_key,
                                   record=lambda reason: metrics.record_channel_rejects("main", reason, 1),
                                   curve_client_key=client_key)
        if self.channel.encrypted and client_key is None:
            logger.warning("sglang-pdd main: CURVE without SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY: a keypair is drawn per "
                           "connection, which only a relay admitting any key ('*') accepts")
        self.relays = cfg.relay_set
        self.verifier = ParamsVerifier(secret)
        self.handoff = MainHandoff(self.channel, timeout_s=cfg.handoff_timeout,
                                   keep_kv_when_relay_finishes=cfg.relay_finished_kv == "keep",
                                   mode=cfg.handoff_mode, chunk=cfg.catchup_chunk, gap=cfg.catchup_gap,
                                   kv_timeout_s=cfg.kv_timeout, record=_record)
        self.attention = attention
        self.last_extend = None  # the EXTEND batch that ran last iteration, merged on the next one
        # catch-up EXTENDs whose result is not taken yet, by their requests (under the overlap
        # scheduler a result arrives one iteration late, for a copy of the batch)
        self._chunks: dict[tuple[int, ...], list] = {}
        self._registered: set[int] = set()
        self._held_published = -1
        self.sync = RankSync(scheduler)  # TP > 1: the other ranks replay this rank's decisions
        self._extend_op = None  # this selection's EXTEND, for them

    def start(self) -> None:
        """Warm the handoff attention kernel up for this pool (CUDA only)."""
        self.attention.warm_up(self.scheduler)

    # -- admission --------------------------------------------------------------------------
    def admit(self, req: Any) -> None:
        """A request sglang just queued. Its PDD parameters come from the client's body: a relay not
        named by --pdd-relays, or any failure to take the request, ends that request, never the server
        (on every TP rank: the other ranks replay the refusal, rank_sync)."""
        try:
            refusal = self._admit(req)
        except Exception as e:  # whatever went wrong concerns this request only
            logger.exception("request %s: cannot take the relayed request", req.rid)
            self.handoff.drop(req.rid)
            refusal = (f"pdd: cannot take the relayed request: {type(e).__name__}: {e}", 503)
        if refusal is not None:
            end_queued(req, *refusal)
        if self.sync.active:
            self.sync.exchange(Round(ops=[Refuse(req.rid, *refusal)] if refusal else []))

    def _admit(self, req: Any) -> tuple[str, int] | None:
        try:
            params = parse(req.sampling_params.custom_params)
        except RequestParamsError as e:
            return str(e), 400
        if params is None or params.relay is None:
            return None  # a plain P->MD request
        if params.relay not in self.relays:
            return f"pdd: relay {params.relay!r} is not one of this server's --pdd-relays", 400
        try:
            self.verifier.check(params, req.bootstrap_room)  # only the router's, for this room, once
        except RequestParamsError as e:
            return str(e), 400
        error = self._track(req, params)
        self._register_sockets()
        return (error, 503) if error is not None else None

    def _register_sockets(self) -> None:
        for sock in self.channel.sockets():  # RLD's tokens end an idle wait
            if id(sock) not in self._registered:
                idle_wait.watch(self.scheduler, sock)
                self._registered.add(id(sock))

    # -- every iteration, after sglang's own process_decode_queue ----------------------------
    def poll(self) -> None:
        s = self.scheduler
        self._before_poll()
        keep = []
        for req in s.waiting_queue:
            if self.handoff.is_relayed(req) and not req.finished():
                self.sync.record(Hold(req.rid))
                ended = self.handoff.kv_arrived(req, md_batch=self.md_batch())  # leaves sglang's queues: held until the tokens come
                if ended is not None:
                    self._abort(ended)
            else:
                keep.append(req)
        if len(keep) != len(s.waiting_queue):
            s.waiting_queue = keep
        for a in self.handoff.poll():
            self._abort(a)
        self._publish_held()
        if self.sync.active:
            self.sync.flush(busy=self.busy())

    def _publish_held(self) -> None:
        """The held gauge whenever it changes (clients wait on it), not only at the publish rate."""
        n = len(self.handoff.held())
        if n != self._held_published:
            self._held_published = n
            metrics.set_held("main", n)

    def md_batch(self) -> int:
        return len(self.scheduler.running_batch.reqs)

    def publish(self) -> None:
        """Gauges for /metrics (at a bounded rate; the counters are recorded as their events happen)."""
        self._publish_held()
        metrics.set_handoff_requests("main", {state.value: n for state, n in self.handoff.counts().items()})

    def _abort(self, a, keep_kv: bool = True) -> None:
        if a.relay_finished:
            metrics.record_relay_finished("main")
        else:
            metrics.record_handoff_failure("main", a.message.split(":")[1].strip()[:40] if ":" in a.message else "error")
        self.sync.record(RankAbort(a.req.rid, a.held, a.message, a.relay_finished, keep_kv))
        end_request(self.scheduler, a.req, a.held, a.message, a.relay_finished, keep_kv)

    def on_abort_request(self, rid: str, message: str | None, abort_all: bool = False) -> None:
        """After sglang's abort_request, which ended the requests still in its own queues (admitted,
        draining): forget those, and end the held ones, which only this runtime sees."""
        for p in self.handoff.matching(rid, abort_all):
            held = self.handoff.drop(p.req.rid)
            if held is not None:
                self._abort(Abort(held, held=True, message=message or "Aborted by AbortReq.", relay_finished=False))
        self._publish_held()

    def busy(self) -> bool:
        return bool(self.handoff.pending) or self.last_extend is not None or bool(self._chunks)

    # -- catch-up chunks: their EXTEND writes KV and nothing else ---------------------------------
    def on_batch_result(self, batch, result) -> bool:
        """The handoff attention's armed window ends; a catch-up chunk's result is consumed here."""
        self.attention.disarm(batch)
        items = self._chunks.pop(chunk_key(batch), None) if batch is not None and self._chunks else None
        if items is None:
            return False
        self._on_chunk_result(result, items)
        return True

    def _on_chunk_result(self, result, items: list) -> None:
        """Instead of sglang's result processing: the sampled token is dropped (RLD's next token is
        what counts), nothing is streamed, and the requests go back to waiting for tokens."""
        copy_done = getattr(result, "copy_done", None)
        if copy_done is not None:
            copy_done.synchronize()
        md_batch = self.md_batch()
        for p in items:
            if p.req.finished():
                continue
            self.handoff.chunk_done(p, md_batch)

    # -- batch selection ----------------------------------------------------------------------
    def next_batch(self, running_batch):
        """(handoff or catch-up EXTEND or None, running batch); the EXTEND's attention may take the
        handoff kernel (armed until its result, or the next selection). The caller prepares the batch
        for DP attention as its own (sglang with patch 0003; the stock hook)."""
        self.attention.disarm()  # last round's handoff batch has run
        self._extend_op = None
        batch, running_batch = self._select(running_batch)
        if self.sync.active:
            self.sync.exchange(Round(ops=[self._extend_op] if batch is not None else []))
        if batch is not None:
            self.attention.arm(batch, batch.batch_size(), policy=self._attention_policy())
        return batch, running_batch

    def _select(self, running_batch):
        """Merge last iteration's EXTEND batch; return (extend batch or None, running batch)."""
        s = self.scheduler
        self._before_select()
        if self.last_extend is not None:
            running_batch, self.last_extend = extend_batch.merged(running_batch, self.last_extend), None
        free_rows = min(s.max_running_requests, s.req_to_token_pool.size) - running_batch.batch_size()
        if free_rows <= 0:
            return None, running_batch
        page = max(1, s.token_to_kv_pool_allocator.page_size)
        budget = pool_state.free_kv(s)

        def cost(p):
            return extend_batch.slots_needed(len(p.req.origin_input_ids) + p.have, len(p.tokens), page)

        items = [] if self._hold_finals() else \
            self.handoff.take_ready(free_rows, budget, solo=extend_batch.needs_penalties, cost=cost)
        final = bool(items)
        if not items:  # no final handoff this iteration: recompute catch-up chunks, if any
            items = self.handoff.take_ready(free_rows, budget, cost=cost, final=False)
        if not items:
            return None, running_batch
        try:
            batch = extend_batch.build(s, items, final=final)
        except Exception as e:  # a broken handoff ends these requests, never the server
            logger.exception("handoff EXTEND could not be built")

            for p in items:
                self.handoff.drop(p.req.rid)  # a catch-up chunk's request is still pending
                self._abort(Abort(p.req, held=True, message=f"pdd: handoff failed: {e}", relay_finished=False),
                            keep_kv=False)
            return None, running_batch
        if self.sync.active:
            self._extend_op = Extend(final, tuple(ExtendItem(p.req.rid, p.have, tuple(p.tokens),
                                                             tuple(p.logprobs) if p.logprobs else None)
                                                  for p in items))
        if not final:
            self._chunks[chunk_key(batch)] = items
            return batch, running_batch
        self.last_extend = batch
        self._after_final_extend(items)
        metrics.record_extend_batch(len(items))
        for p in items:
            metrics.record_handoff("main", p.handoff_tokens)
        self._publish_held()
        return batch, running_batch

    # -- hooks, plain here: the tests' negative controls override them (controls.py) ---------------
    def _track(self, req: Any, params) -> str | None:
        """Hand an admitted relayed request to the handoff state machine; the error that ends it, if any."""
        return self.handoff.admit(req, params)

    def _before_poll(self) -> None:
        """At the start of each poll, before the relayed requests leave the waiting queue."""

    def _attention_policy(self):
        """The handoff attention's KernelPolicy for the EXTEND about to run (None: its default)."""
        return None

    def _before_select(self) -> None:
        """At the start of each batch selection, before last iteration's EXTEND is merged."""

    def _hold_finals(self) -> bool:
        """Whether this selection starts no final handoff EXTEND even though some are ready."""
        return False

    def _after_final_extend(self, items: list) -> None:
        """After a final handoff EXTEND of these handoffs is built, before it runs."""


def end_request(s, req, held: bool, message: str, relay_finished: bool, keep_kv: bool = True) -> None:
    """End one of MD's relayed requests: in sglang's queues through its abort path, which frees all;
    held (only the plugin sees it) with the abort finish, streamed, its KV released."""
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.mem_cache.common import release_kv_cache

    if not held:  # still in sglang's prealloc/transfer queues: its own abort path frees all
        s.abort_request(AbortReq(rid=req.rid, abort_message=message))
        return
    prepare_abort(req, message, status_code=None if relay_finished else 500)
    s.output_streamer.stream_output([req], req.return_logprob)
    # The prompt's KV is valid: keep it in the radix tree, so MD's cache stays aligned with P's.
    release_kv_cache(req, s.tree_cache, checkpoint=keep_kv)


def chunk_key(batch) -> tuple[int, ...]:
    """A catch-up EXTEND's identity that its copy shares (sglang's overlap loop queues `batch.copy()`
    with the result): its requests, each of which is in at most one chunk in flight."""
    return tuple(id(r) for r in batch.reqs)


def _record(event: str, value: Any) -> None:
    """MainHandoff's events on /metrics."""
    if event == "chunk":
        metrics.record_catchup("main", "chunks", 1)
        metrics.record_catchup("main", "tokens", value)
    elif event == "handoff":
        metrics.record_handoff_mode("main", value or "unknown", "relay_chose")
    elif event == "unknown_message":
        metrics.record_channel_rejects("main", "unknown_room", 1)
