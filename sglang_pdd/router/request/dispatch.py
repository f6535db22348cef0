"""One request through the pipeline the policy picks: P->MD, P->RLD->MD, or (odd traffic) P->RLD.

The dispatcher plans the bootstrap rooms and each role's copy of the request (`protocol.room_plan`:
R for RLD, R2 for MD; P's copy carries `main_room` so its fan-out sender feeds RLD and MD), sends
them at once, and turns the streams that come back into one sequence of `Delta`s (see
`stitch.Stitcher`). It owns the request's life on every role: when the client goes away, or anything
fails, it aborts the request's copies on every role it reached; it never leaves a role waiting.
Each role's copy runs as a task (`role_copies`), its stream is read into deltas by `drain`, a role's
failure migrates the rest (`migration/`); the standing work on the peers (session, health checks,
feeds) is `peers.services`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import AsyncIterator

from sglang_pdd.policy.pipeline import NO_MAIN, Pipeline, PipelinePolicy, RouteInputs
from sglang_pdd.protocol import room_plan
from sglang_pdd.protocol.request import without_internal
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.router.cache.kv_subscriber import KvEventSource
from sglang_pdd.router.peers.placement import MainChoice, Placement
from sglang_pdd.router.peers.relay_pool_signal import RelayPoolSignal
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.peers.services import PeerServices, Polls
from sglang_pdd.router.request import idle_deadline
from sglang_pdd.router.request.dispatch_config import DispatchConfig
from sglang_pdd.router.request.drain import drain
from sglang_pdd.router.request.failure import RequestFailed, RoleFailure
from sglang_pdd.router.request.migration import resumed_feeds, rules as migration
from sglang_pdd.router.request.migration.limits import MigrationLimits
from sglang_pdd.router.request.outcome import Attempt, Outcome
from sglang_pdd.router.request.request_text import Decode, RequestText
from sglang_pdd.router.request.role_copies import RoleCopies
from sglang_pdd.router.request.stitch import Delta, Stitcher
from sglang_pdd.router.request.stop_watch import StopWatch

logger = logging.getLogger(__name__)

PIPELINE_MODES = ("auto", "relay", "direct")
__all__ = ["PIPELINE_MODES", "Attempt", "DispatchConfig", "Dispatcher", "Outcome", "RequestFailed", "RoleFailure"]


class Dispatcher:
    def __init__(self, prefill: PeerPool, relay: PeerPool, main: PeerPool, cfg: DispatchConfig,
                 decode: Decode, policy: PipelinePolicy | None = None,
                 kv_events: dict[str, KvEventSource] | None = None, signer: ParamsSigner | None = None,
                 kept_stop_ids: frozenset[int] = frozenset()):
        """`decode`: the text of token IDs with sglang's defaults, taking the options a request turns off
        (`request_text.Decode`); `kept_stop_ids`: stop tokens a text keeps (a tool call's closer)."""
        if cfg.pipeline not in PIPELINE_MODES:
            raise ValueError(f"--pipeline must be one of {PIPELINE_MODES}, got {cfg.pipeline!r}")
        if cfg.pipeline != "direct" and not relay and not any(p.token_channel for p in prefill.peers):
            raise ValueError(f"--pipeline {cfg.pipeline} needs at least one --relay or a prefill that relays "
                             "(--prefill URL BOOTSTRAP_PORT TOKEN_PORT)")
        self.prefill, self.relay, self.main, self.cfg = prefill, relay, main, cfg
        self.decode, self.policy, self.kept_stop_ids = decode, policy, kept_stop_ids
        self.signer = signer  # signs P's and MD's PDD parameters (protocol.request_auth); None: unsigned
        self.migration_limits = MigrationLimits(cfg.migration_rate_per_s, cfg.migration_burst, cfg.migration_jitter_s)
        # MD's cache: exact from its KV events where given (peer URL -> source), else approximate
        self.placement = Placement(prefill, relay, main, policy, kv_events, relay_slots=cfg.relay_slots)
        self.pool_signal = (RelayPoolSignal(cfg.relay_pool_scale, cfg.relay_pool_window_s)
                            if cfg.relay_pool_scale is not None else None)
        self.views, self.kv_subscribers = self.placement.views, self.placement.kv_subscribers
        polls = Polls(cfg.health_check_s, cfg.bandwidth_poll_s, cfg.load_poll_s, cfg.role_lock_s)
        self.services = PeerServices((prefill, relay, main), polls, policy.links if policy is not None else None,
                                     self.kv_subscribers)
        self.copies = RoleCopies(cfg, lambda: self.services.session)

    async def start(self) -> None:
        await self.services.start()

    async def close(self) -> None:
        await self.copies.close()
        await self.services.close()

    # -- pipeline choice ------------------------------------------------------------------------
    def choose(self, input_ids: list[int], max_new_tokens: int, md: Peer | MainChoice,
               outcome: Outcome | None = None, mode: str | None = None) -> tuple[Pipeline, str]:
        """The pipeline for a request whose MD is `md` (a peer, or the placement's choice)."""
        hit = md.hit if isinstance(md, MainChoice) else self.views[md.url].match(input_ids)
        if outcome is not None:
            outcome.md_hit = hit
        mode = mode or self.cfg.pipeline
        if mode == "direct":
            return Pipeline.P_MD, "pipeline direct"
        if mode == "relay" or self.policy is None:  # every MD out: RLD alone (the policy's own rule, else)
            return (Pipeline.P_RLD, NO_MAIN) if self.placement.in_service().relay_alone else \
                (Pipeline.P_RLD_MD, "pipeline relay")
        d = self.policy.decide(RouteInputs(len(input_ids), hit, max_new_tokens, site=md.site))
        if outcome is not None:
            outcome.missed_bytes, outcome.predicted_wan_s = d.missed_bytes, d.predicted_wan_s
            outcome.placement, outcome.rule = d.placement, d.rule
        if d.rule and self.pool_signal is not None:
            self.pool_signal.observe(time.monotonic(), d.at_risk)
        return d.pipeline, d.reason

    # -- one request ----------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], sampling_params: dict, extra: dict,
                       outcome: Outcome, pipeline: str | None = None) -> AsyncIterator[Delta]:
        """`pipeline` (auto, relay, direct) overrides --pipeline for this request. Whatever PDD
        parameters the client put in `sampling_params` are dropped: the router sets its own. A role's
        failure migrates the rest of the request (`router.request.migration.rules`) up to --migration-limit times."""
        sampling_params = without_internal(sampling_params)
        try:
            p, mc = self.placement.pick_prefill(input_ids), self.placement.pick_main(input_ids)
            md, outcome.main_choice = mc.peer, mc
            chosen, why = self.choose(input_ids, int(sampling_params.get("max_new_tokens") or 128), mc, outcome,
                                      mode=pipeline)
            up = self.placement.in_service()
            if chosen is Pipeline.P_RLD and outcome.placement == "p" and p.token_channel is not None and up.main:
                chosen, why = Pipeline.P_RLD_MD, f"{why}; a relay on P hands over to MD"  # P's relay needs its MD
            # P relays it itself: a P that relays, unless the relay placement (--ttft-slo-secs) chose the RLD pool
            on_p = chosen is Pipeline.P_RLD_MD and p.token_channel is not None and outcome.placement != "pool"
            if chosen is not Pipeline.P_MD and not on_p and not up.relay and up.main:
                chosen, why = Pipeline.P_MD, f"{why}; no relay in service"  # not a migration spent on a dead RLD
            outcome.pipeline, outcome.reason = chosen, why
            rld = p if on_p else self.placement.pick_relay(input_ids) if chosen is not Pipeline.P_MD else None
            outcome.relay_target = ("prefill" if on_p else "relay") if rld is not None else None
        except LookupError as e:  # a role with no server configured
            raise RequestFailed(str(e), status=503) from None
        if rld is not None:
            outcome.rld_in_flight = rld.in_flight
        a = Attempt(chosen, {"prefill": p, "relay": rld, "main": md},
                    deadline=asyncio.get_running_loop().time() + self.cfg.request_timeout_s,
                    idle_extra_s=idle_deadline.allowance_s(self.cfg.idle_per_token_s, sampling_params))
        text = RequestText.of(self.decode, sampling_params, self.kept_stop_ids)
        stitcher = Stitcher(text.decode, text.text_ids)
        if rld is None:
            stitcher.direct()
        lp = outcome.live_logprobs = []
        watch = StopWatch(sampling_params.get("stop"), text.decode)  # a stop string across a migration
        while a is not None:
            try:
                # aclosing: the client's aclose() runs the attempt's clean-up (every role's abort) at once,
                # not when the collector finds the abandoned generator
                async with aclosing(self._attempt(a, input_ids, sampling_params, extra, outcome, stitcher, lp,
                                                  watch)) as attempt:
                    async for d in attempt:
                        yield d
                return
            except RoleFailure as f:
                a = self._migrate(f, a, input_ids, sampling_params, outcome, stitcher, lp, mode=pipeline)
                if a is not None:
                    watch.arm(stitcher.ids)
                    await self.migration_limits.wait()  # spread a dead MD's streams over P
        # nothing was left to generate: the client's request ends at its length, after what it has
        yield stitcher.end({"type": "length", "length": int(sampling_params.get("max_new_tokens") or 128)})

    def _migrate(self, f: "RoleFailure", a: "Attempt", input_ids: list[int], sampling_params: dict,
                 outcome: Outcome, stitcher: Stitcher, lp: list, mode: str | None = None) -> "Attempt | None":
        """The next attempt after `f`, or raise its failure; None: nothing is left to generate. `mode`:
        the request's pipeline mode (auto, relay, direct), for a migration that may relay."""
        peer = a.peers.get(f.role)
        if peer is not None and f.cause == "idle" and f.silent:  # the others were counted where they happened (_run)
            peer.health.failed()
        if f.cause is not None and migration.resumed_request([], sampling_params, stitcher.ids) is None:
            return None  # the client has every token it asked for: nothing to migrate

        # a stalled MD: its site's WAN may be down, so an MD there is no way out (RLD, next to P, is)
        same_site = f.role == "main" and peer is not None and f.cause in migration.STALLS

        def in_service(pool: PeerPool) -> bool:  # a peer of the pool other than the failed one
            return any(x is not peer and not x.health.out and not (same_site and pool is self.main and x.site == peer.site)
                       for x in pool.peers)

        d = migration.decide(f.role, f.cause, len(outcome.migrations), self.cfg.migration_limit,
                             sampling_params, len(stitcher.ids), main_ok=in_service(self.main),
                             relay_ok=in_service(self.relay))
        if d.pipeline is None:
            outcome.unmigrated = f.cause
            logger.info("not migrating after %s failed (%s): %s", f.role, f.cause, d.reason)
            raise f.failed
        if not self.migration_limits.take():
            outcome.unmigrated = f.cause
            logger.warning("not migrating after %s failed (%s): %s", f.role, f.cause, self.migration_limits.refusal())
            raise RequestFailed(f"{f.failed}; not migrated: {self.migration_limits.refusal()}", status=503)
        logger.info("migrating after %s failed (%s) with %d tokens sent: %s, %s", f.role, f.cause,
                    len(stitcher.ids), d.pipeline.value, d.reason)
        outcome.migrations.append(f.cause)
        exclude = (peer,) if peer is not None else ()
        relayed_on_p = f.role == "relay" and peer is a.peers.get("prefill")  # P itself failed: not it again
        if same_site:  # nor an MD behind the same WAN
            exclude += tuple(x for x in self.main.peers if x is not peer and x.site == peer.site)
        pipe = d.pipeline
        peers = {"prefill": self.prefill.pick(exclude if f.role == "prefill" or relayed_on_p else ()),
                 "main": self.main.pick(exclude if f.role == "main" else ()) if pipe is Pipeline.P_MD else None,
                 "relay": self.relay.pick(exclude if f.role == "relay" else ()) if pipe is Pipeline.P_RLD else None}
        self.placement.chose_prefill(peers["prefill"])  # the policy reads the lane of the P the copy uses
        if d.may_relay:  # the resumed request on its new MD, as any request: P->RLD->MD where MD misses much
            resumed = migration.resumed_request(input_ids, sampling_params, stitcher.ids)
            pipe, why = self.choose(resumed[0], int(resumed[1].get("max_new_tokens") or 128), peers["main"], mode=mode)
            on_p = pipe is Pipeline.P_RLD_MD and peers["prefill"].token_channel is not None
            if pipe is not Pipeline.P_MD and (on_p or self.relay):  # through a relay (P->RLD: odd traffic)
                peers["relay"] = peers["prefill"] if on_p else self.relay.pick()
                peers["main"] = peers["main"] if pipe is Pipeline.P_RLD_MD else None
                logger.info("migration goes %s: %s", pipe.value, why)
            else:
                pipe = Pipeline.P_MD
        outcome.migration_pipelines.append(pipe.value)
        stitcher.resume(relayed=pipe is Pipeline.P_RLD_MD)
        del lp[len(stitcher.ids):]
        return Attempt(pipe, peers, prefix=list(stitcher.ids), migrated=True, deadline=a.deadline,
                       idle_extra_s=a.idle_extra_s)

    async def _attempt(self, a: "Attempt", input_ids: list[int], sampling_params: dict, extra: dict,
                       outcome: Outcome, stitcher: Stitcher, lp: list, watch: StopWatch) -> AsyncIterator[Delta]:
        """One try at the request on `a`'s peers; a migrated one goes on from `a.prefix`."""
        p, rld, md = a.peers["prefill"], a.peers["relay"], a.peers["main"]
        ids, sp = (list(input_ids), dict(sampling_params)) if not a.migrated else \
            migration.resumed_request(input_ids, sampling_params, a.prefix)
        rooms = room_plan.new_rooms()
        plan = room_plan.plan({"input_ids": ids, "sampling_params": sp, **extra},
                              a.pipeline, p.host, p.bootstrap_port, rld.token_channel if rld is not None else None,
                              rooms=rooms, rid=f"pdd-{rooms[0]:x}", signer=self.signer,
                              relay_here=rld is not None and rld is p)
        calls = [(name, a.peers[name], body) for name, body in plan.bodies.items()]
        queues, tasks = self.copies.start(calls, a.deadline)
        feed_relay, feed_main = stitcher.feed_relay, stitcher.feed_main
        if a.migrated:
            feed_relay, feed_main = resumed_feeds.feeds(stitcher, len(a.prefix), a.pipeline is Pipeline.P_RLD_MD, watch)
        try:
            if rld is not None:
                async with aclosing(self._drain("relay", queues["relay"], feed_relay, lp, a, rld)) as deltas:
                    async for d in deltas:
                        yield d
                if stitcher.done:  # the relay finished the request itself (or the router ended it there)
                    del lp[len(stitcher.ids):]
                    outcome.output_logprobs = lp or None
                    if a.pipeline is Pipeline.P_RLD_MD and not stitcher.ended_here:  # MD keeps landing its KV
                        # P's copy too: P answers only once MD's part is done, and aborting it would
                        # fail MD's transfer.
                        self.copies.leave_running([t for (name, _, _), t in zip(calls, tasks) if name in ("main", "prefill")],
                                            [queues["main"]])
                        self.placement.landed(md, input_ids)  # MD gets the prompt, not RLD's output
                    return
                if outcome.handoff_tokens is None:  # the first handoff (a migrated P->RLD->MD copy has its own)
                    outcome.handoff_tokens, outcome.handoff_mode = stitcher.handoff_tokens, stitcher.handoff_mode
            async with aclosing(self._drain("main", queues["main"], feed_main, lp, a, md)) as deltas:
                async for d in deltas:
                    yield d
            del lp[len(stitcher.ids):]  # a stop the router found may end a chunk early (stop_watch)
            outcome.output_logprobs = lp or None
            self.placement.landed(md, list(input_ids) + stitcher.ids)
        finally:
            await self.copies.release_shielded(calls, tasks, stitcher.done)

    def _drain(self, role: str, q: asyncio.Queue, feed, lp: list, a: Attempt, peer: Peer) -> AsyncIterator[Delta]:
        return drain(role, q, feed, lp, a, peer, self.cfg.idle(role), self.cfg.request_timeout_s)
