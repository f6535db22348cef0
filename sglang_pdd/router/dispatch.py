"""One request through the pipeline the policy picks: P->MD, P->RLD->MD, or (odd traffic) P->RLD.

The dispatcher plans the bootstrap rooms and each role's copy of the request (`protocol.room_plan`:
R for RLD, R2 for MD; P's copy carries `main_room` so its fan-out sender feeds RLD and MD), sends
them at once, and turns the streams that come back into one sequence of `Delta`s (see
`stitch.Stitcher`). It owns the request's life on every role: when the client goes away, or anything
fails, it aborts the request's copies on every role it reached; it never leaves a role waiting.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import aiohttp

from sglang_pdd.router.cache.kv_subscriber import KvEventSource
from sglang_pdd.protocol import room_plan
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.router import admission, idle_deadline, load_feed, migration, resumed_feeds, upstream
from sglang_pdd.router.dispatch_config import DispatchConfig
from sglang_pdd.router.migration_limits import MigrationLimits
from sglang_pdd.router.peer_health import HealthChecker
from sglang_pdd.router.peers import Peer, PeerPool
from sglang_pdd.router.request_failure import RequestFailed, RoleFailure, failure_of, timed_out
from sglang_pdd.policy.pipeline import NO_MAIN, Pipeline, PipelinePolicy, RouteInputs
from sglang_pdd.router.bandwidth_feed import TransferRateFeed
from sglang_pdd.router.placement import MainChoice, Placement
from sglang_pdd.router.output_view import OutputView
from sglang_pdd.router.stitch import Delta, Stitcher, StitchError
from sglang_pdd.router.stop_watch import StopWatch

logger = logging.getLogger(__name__)

PIPELINE_MODES = ("auto", "relay", "direct")
# Chunks of one role's stream queued for the client at most: past this the role's stream is not read,
# so a slow client pushes back on the role over TCP instead of growing the router's memory.
QUEUE_CHUNKS = 64
__all__ = ["PIPELINE_MODES", "Attempt", "DispatchConfig", "Dispatcher", "Outcome", "RequestFailed", "RoleFailure"]


@dataclass
class Attempt:
    """One try at a request: its pipeline and peers (role -> peer, None where not used); a migrated
    one goes on after `prefix`, the tokens the client already has. `deadline` (the event loop's clock):
    the request's end by --request-timeout, over all its attempts; `idle_extra_s`: what the client's
    own parameters add to each idle deadline (`idle_deadline`)."""

    pipeline: Pipeline
    peers: dict[str, Peer | None]
    prefix: list[int] = field(default_factory=list)
    migrated: bool = False
    deadline: float = float("inf")
    idle_extra_s: float = 0.0


@dataclass
class Outcome:
    """What the dispatcher learned about one request (for /metrics, logs and the response)."""

    pipeline: Pipeline | None = None
    reason: str = ""
    handoff_k: int | None = None
    handoff_mode: str | None = None
    output_logprobs: list | None = None
    live_logprobs: list | None = None  # the client's tokens' logprobs so far, aligned with its tokens
    md_hit: int | None = None  # prompt tokens the router saw in MD's cache at the decision
    missed_bytes: int | None = None  # MD's predicted missed KV bytes (what P->MD would send over the WAN)
    predicted_wan_s: float | None = None
    rld_in_flight: int | None = None  # requests in flight on the chosen relay at the decision
    main_choice: MainChoice | None = None  # which MD, and what the choice saw
    migrations: list[str] = field(default_factory=list)  # the cause of each migration, in order
    migration_pipelines: list[str] = field(default_factory=list)  # the pipeline each migration took
    unmigrated: str | None = None  # the cause of the failure that ended the request unmigrated


class Dispatcher:
    def __init__(self, prefill: PeerPool, relay: PeerPool, main: PeerPool, cfg: DispatchConfig,
                 decode: Callable[[list[int]], str], policy: PipelinePolicy | None = None,
                 kv_events: dict[str, KvEventSource] | None = None, signer: ParamsSigner | None = None):
        if cfg.pipeline not in PIPELINE_MODES:
            raise ValueError(f"--pipeline must be one of {PIPELINE_MODES}, got {cfg.pipeline!r}")
        if cfg.pipeline != "direct" and not relay:
            raise ValueError(f"--pipeline {cfg.pipeline} needs at least one --relay")
        self.prefill, self.relay, self.main, self.cfg = prefill, relay, main, cfg
        self.decode, self.policy = decode, policy
        self.signer = signer  # signs P's and MD's PDD parameters (protocol.request_auth); None: unsigned
        self.migration_limits = MigrationLimits(cfg.migration_rate_per_s, cfg.migration_burst, cfg.migration_jitter_s)
        # MD's cache: exact from its KV events where given (peer URL -> source), else approximate
        self.placement = Placement(prefill, relay, main, policy, kv_events)
        self.views, self.kv_subscribers = self.placement.views, self.placement.kv_subscribers
        self.session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task] = set()  # MD copies left to land their KV
        self._releasing: set[asyncio.Task] = set()  # requests' clean-ups (see generate)

    async def start(self) -> None:
        from sglang_pdd.router import role_auth  # every call to a role carries the router's key

        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=role_auth.headers())
        for sub in self.kv_subscribers:
            sub.start()
        if self.cfg.health_check_s > 0:
            checker = HealthChecker((self.prefill, self.relay, self.main), self.cfg.health_check_s)
            self._health_task = asyncio.create_task(checker.run_forever(self.session))
        if self.policy is not None and self.cfg.bandwidth_poll_s > 0:
            sites = {p.host: p.site for p in self.main.peers}
            self.feed = TransferRateFeed(self.policy.links, site_of=lambda host: sites.get(host, ""))
            self._feed_task = asyncio.create_task(self.feed.poll_forever(
                self.session, [p.url for p in self.prefill.peers], self.cfg.bandwidth_poll_s))
        if self.cfg.load_poll_s > 0:
            peers = self.prefill.peers + self.relay.peers + self.main.peers
            self._load_task = asyncio.create_task(load_feed.poll_forever(self.session, peers, self.cfg.load_poll_s))

    async def close(self) -> None:
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await asyncio.gather(*(sub.close() for sub in self.kv_subscribers))
        for task in (getattr(self, "_feed_task", None), getattr(self, "_load_task", None),
                     getattr(self, "_health_task", None)):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

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
        return d.pipeline, d.reason

    # -- one request ----------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], sampling_params: dict, extra: dict,
                       outcome: Outcome, pipeline: str | None = None) -> AsyncIterator[Delta]:
        """`pipeline` (auto, relay, direct) overrides --pipeline for this request. Whatever PDD
        parameters the client put in `sampling_params` are dropped: the router sets its own. A role's
        failure migrates the rest of the request (`router.migration`) up to --migration-limit times."""
        sampling_params = admission.without_internal(sampling_params)
        try:
            p, mc = self.placement.pick_prefill(input_ids), self.placement.pick_main(input_ids)
            md, outcome.main_choice = mc.peer, mc
            chosen, why = self.choose(input_ids, int(sampling_params.get("max_new_tokens") or 128), mc, outcome,
                                      mode=pipeline)
            up = self.placement.in_service()
            if chosen is not Pipeline.P_MD and not up.relay and up.main:
                chosen, why = Pipeline.P_MD, f"{why}; no relay in service"  # not a migration spent on a dead RLD
            outcome.pipeline, outcome.reason = chosen, why
            rld = self.placement.pick_relay(input_ids) if chosen is not Pipeline.P_MD else None
        except LookupError as e:  # a role with no server configured
            raise RequestFailed(str(e), status=503) from None
        if rld is not None:
            outcome.rld_in_flight = rld.in_flight
        a = Attempt(chosen, {"prefill": p, "relay": rld, "main": md},
                    deadline=asyncio.get_running_loop().time() + self.cfg.request_timeout_s,
                    idle_extra_s=idle_deadline.allowance_s(self.cfg.idle_per_token_s, sampling_params))
        stitcher = Stitcher(self.decode) if rld is not None else Stitcher(self.decode).direct()
        lp = outcome.live_logprobs = []
        watch = StopWatch(sampling_params.get("stop"), self.decode)  # a stop string across a migration
        while a is not None:
            try:
                async for d in self._attempt(a, input_ids, sampling_params, extra, outcome, stitcher, lp, watch):
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
        if same_site:  # nor an MD behind the same WAN
            exclude += tuple(x for x in self.main.peers if x is not peer and x.site == peer.site)
        pipe = d.pipeline
        peers = {"prefill": self.prefill.pick(exclude if f.role == "prefill" else ()),
                 "main": self.main.pick(exclude if f.role == "main" else ()) if pipe is Pipeline.P_MD else None,
                 "relay": self.relay.pick(exclude if f.role == "relay" else ()) if pipe is Pipeline.P_RLD else None}
        self.placement.chosen_prefill = peers["prefill"]  # the policy reads the lane of the P the copy uses
        if d.may_relay:  # the resumed request on its new MD, as any request: P->RLD->MD where MD misses much
            resumed = migration.resumed_request(input_ids, sampling_params, stitcher.ids)
            pipe, why = self.choose(resumed[0], int(resumed[1].get("max_new_tokens") or 128), peers["main"], mode=mode)
            if pipe is not Pipeline.P_MD:  # through a relay (P->RLD alone: odd traffic, as for any request)
                peers["relay"] = self.relay.pick()
                peers["main"] = peers["main"] if pipe is Pipeline.P_RLD_MD else None
                logger.info("migration goes %s: %s", pipe.value, why)
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
                              rooms=rooms, rid=f"pdd-{rooms[0]:x}", signer=self.signer)
        calls = [(name, a.peers[name], body) for name, body in plan.bodies.items()]
        queues, tasks = self._start(calls, a.deadline)
        feed_relay, feed_main = stitcher.feed_relay, stitcher.feed_main
        if a.migrated:
            feed_relay, feed_main = resumed_feeds.feeds(stitcher, len(a.prefix), a.pipeline is Pipeline.P_RLD_MD, watch)
        try:
            if rld is not None:
                async for d in self._drain("relay", queues["relay"], feed_relay, lp, a, rld):
                    yield d
                if stitcher.done:  # the relay finished the request itself (or the router ended it there)
                    del lp[len(stitcher.ids):]
                    outcome.output_logprobs = lp or None
                    if a.pipeline is Pipeline.P_RLD_MD and not stitcher.ended_here:  # MD keeps landing its KV
                        # P's copy too: P answers only once MD's part is done, and aborting it would
                        # fail MD's transfer.
                        self._leave_running([t for (name, _, _), t in zip(calls, tasks) if name in ("main", "prefill")],
                                            [queues["main"]])
                        self.placement.landed(md, input_ids)  # MD gets the prompt, not RLD's output
                    return
                if outcome.handoff_k is None:  # the first handoff (a migrated P->RLD->MD copy has its own)
                    outcome.handoff_k, outcome.handoff_mode = stitcher.handoff_k, stitcher.handoff_mode
            async for d in self._drain("main", queues["main"], feed_main, lp, a, md):
                yield d
            del lp[len(stitcher.ids):]  # a stop the router found may end a chunk early (stop_watch)
            outcome.output_logprobs = lp or None
            self.placement.landed(md, list(input_ids) + stitcher.ids)
        finally:
            # Shielded: a handler cancelled while it lets go (the client's connection dropped just after
            # a write to it failed) must still abort every role's copy.
            release = asyncio.ensure_future(self._release(calls, tasks, stitcher.done))
            self._releasing.add(release)
            release.add_done_callback(self._releasing.discard)
            await asyncio.shield(release)

    def _start(self, calls: list[tuple[str, Peer, dict]],
               deadline: float) -> tuple[dict[str, asyncio.Queue], list[asyncio.Task]]:
        """One task per role's copy; RLD's and MD's chunks go to a queue each. P's failure ends the
        request too (it goes to every queue): without P's KV no role can go on."""
        queues = {name: asyncio.Queue(maxsize=QUEUE_CHUNKS) for name, _, _ in calls if name != "prefill"}
        tasks = [asyncio.create_task(self._run(name, peer, body, [queues[name]] if name in queues
                                               else list(queues.values()), deadline)) for name, peer, body in calls]
        return queues, tasks

    async def _release(self, calls: list[tuple[str, Peer, dict]], tasks: list[asyncio.Task], done: bool) -> None:
        """Cancel the request's role tasks and abort its copies on every role it reached (unless it
        ended normally), except the copies left to finish on their own."""
        mine = [(body, peer, t) for (_, peer, body), t in zip(calls, tasks) if t not in self._background]
        pending = [t for _, _, t in mine if not t.done()]
        for t in pending:
            t.cancel()
        if pending or not done:
            await asyncio.gather(*(upstream.abort(self.session, peer.url, body["rid"]) for body, peer, _ in mine),
                                 return_exceptions=True)
        await asyncio.gather(*(t for _, _, t in mine), return_exceptions=True)

    def _leave_running(self, tasks: list[asyncio.Task], queues: list[asyncio.Queue]) -> None:
        """Let these requests finish on their own (bounded by the request timeout); nobody reads them:
        their queues are emptied once, which wakes a copy blocked on a full one, and it queues no more."""
        for t in tasks:
            self._background.add(t)
            t.add_done_callback(self._background.discard)
        for q in queues:
            while not q.empty():
                q.get_nowait()

    async def _run(self, role: str, peer: Peer, body: dict, to: list[asyncio.Queue], deadline: float) -> None:
        """One role's copy: its chunks go to its queue; however it fails, the failure goes to every
        queue in `to`, so that whoever drains one ends the client's request instead of waiting. The
        request's deadline ending it is the client's 504, not the peer's failure."""
        loop, mark = asyncio.get_running_loop(), peer.health.progress
        peer.in_flight += 1
        try:
            if role == "prefill":  # P answers once its KV went out; its reply carries nothing the client sees
                await upstream.post_json(self.session, role, peer.url, "/generate", body,
                                         max(0.001, min(self.cfg.idle(role), deadline - loop.time())))
                peer.health.progressed()
                peer.health.succeeded()
                return
            left = max(0.001, deadline - loop.time())
            async for chunk in upstream.stream_generate(self.session, role, peer.url, body, left):
                peer.health.progressed()
                if asyncio.current_task() not in self._background:  # a full queue stops reading the role
                    await to[0].put(chunk)
            peer.health.succeeded()
        except Exception as e:
            if isinstance(e, upstream.UpstreamError) and e.kind == "timeout" and loop.time() >= deadline - 0.01:
                e = timed_out(self.cfg.request_timeout_s)
            elif isinstance(e, upstream.UpstreamError):
                self._count_failure(peer, e, silent=idle_deadline.silent(mark, peer.health.progress))
                logger.info("%s copy of %s ended with %s", role, body.get("rid"), e)
            else:
                logger.exception("%s copy of %s failed", role, body.get("rid"))
            for q in to:
                if asyncio.current_task() not in self._background:
                    await q.put(e)
        finally:
            peer.in_flight -= 1

    def _count_failure(self, peer: Peer, e: "upstream.UpstreamError", silent: bool = True) -> None:
        """A copy that failed on its own counts against its peer's health; not a client's error (4xx),
        not a copy left to finish in the background (RLD's Finished aborts MD's), not P's late reply
        while P answered others (`idle_deadline`)."""
        if asyncio.current_task() in self._background or migration.cause_of(e) is None:
            return
        if e.kind == "timeout" and not silent:
            return
        if peer.health.failed(unreachable=e.kind == "unreachable"):
            logger.warning("%s %s is out of service after %d failures in a row", e.role, peer.url,
                           peer.health.failures)

    async def _drain(self, role: str, q: asyncio.Queue, feed, lp: list, a: Attempt, peer: Peer) -> AsyncIterator[Delta]:
        """`peer`: the role's, whose silence the idle deadline measures; `a.prefix`: the client's tokens
        before this copy's output (a migrated copy)."""
        loop, lp_offset, started = asyncio.get_running_loop(), len(a.prefix), False
        idle = self.cfg.idle(role) + a.idle_extra_s
        output = OutputView()  # this copy's whole output, streamed cumulatively or as deltas
        while True:
            if not q.empty():  # a chunk already waiting needs no timer (wait_for costs a task per call)
                item = q.get_nowait()
            else:
                left, mark = a.deadline - loop.time(), peer.health.progress
                try:
                    item = await asyncio.wait_for(q.get(), max(0.0, min(idle, left)))
                except TimeoutError:
                    if left <= idle:
                        raise timed_out(self.cfg.request_timeout_s) from None
                    raise RoleFailure(role, "idle", RequestFailed(f"{role}: no output for {idle:g}s", status=504),
                                      silent=idle_deadline.silent(mark, peer.health.progress)) from None
            if isinstance(item, RequestFailed):  # the request's deadline, met by a role's copy
                raise item
            if isinstance(item, Exception):
                failed_role = getattr(item, "role", role)
                if role == "relay" and started and failed_role == "prefill":
                    continue  # RLD has its KV and streams on; P's failure is MD's (its queue has it too)
                raise RoleFailure(failed_role, migration.cause_of(item), failure_of(item))
            started = True
            meta = item.get("meta_info") or {}
            reason = meta.get("finish_reason")
            try:
                ids, got = output.push(item)
                delta = feed(ids, reason)
            except StitchError as e:
                raise RequestFailed(f"pdd stitching: {e}", status=502) from None
            except (TypeError, ValueError, KeyError, AttributeError) as e:  # a chunk not shaped as sglang's
                logger.warning("%s sent a malformed chunk: %r", role, e)
                raise RequestFailed(f"{role}: a malformed stream chunk", status=502) from None
            if got:  # cumulative, aligned with output_ids; after the handoff MD's repeats t1..tk
                lp.extend(got[len(lp) - lp_offset:])
            if delta.token_ids or delta.text or delta.finish_reason:
                yield delta
            if reason is not None or delta.finish_reason is not None:
                return

