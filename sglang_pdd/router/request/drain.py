"""One role copy's chunks, as the client's deltas: the copy's queue read under the idle and request
deadlines, each chunk fed to the stitcher, a role's failure turned into the request's (`RoleFailure`
for migration, `RequestFailed` for the client)."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

from sglang_pdd.router.peers.pool import Peer
from sglang_pdd.router.request import idle_deadline
from sglang_pdd.router.request.failure import RequestFailed, RoleFailure, failure_of, timed_out
from sglang_pdd.router.request.migration import rules as migration
from sglang_pdd.router.request.outcome import Attempt
from sglang_pdd.router.request.output_view import OutputView
from sglang_pdd.router.request.stitch import Delta, StitchError

logger = logging.getLogger(__name__)


async def drain(role: str, q: asyncio.Queue, feed: Callable, lp: list, a: Attempt, peer: Peer,
                idle_s: float, request_timeout_s: float) -> AsyncIterator[Delta]:
    """`peer`: the role's, whose silence the idle deadline (`idle_s` plus the attempt's allowance)
    measures; `a.prefix`: the client's tokens before this copy's output (a migrated copy)."""
    loop, lp_offset, started = asyncio.get_running_loop(), len(a.prefix), False
    idle = idle_s + a.idle_extra_s
    output = OutputView()  # this copy's whole output, streamed cumulatively or as deltas
    while True:
        if not q.empty():  # a chunk already waiting needs no timer
            item = q.get_nowait()
        else:
            left, mark = a.deadline - loop.time(), peer.health.progress
            try:  # not wait_for: on 3.11 it swallows a cancellation that meets the chunk's arrival (bpo-42130)
                async with asyncio.timeout(max(0.0, min(idle, left))):
                    item = await q.get()
            except TimeoutError:
                if left <= idle:
                    raise timed_out(request_timeout_s) from None
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
