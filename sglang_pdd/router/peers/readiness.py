"""Whether the router can serve a request now: its readiness (`GET /ready`, a Kubernetes readinessProbe).

A request needs a P in service and then either an MD in service (P->MD, P->RLD->MD) or, with every MD
out, an RLD in service to serve it alone: under `--pipeline auto` or `relay` a new request goes P->RLD at
once while no MD is in service (`policy.pipeline.NO_MAIN`), and a request whose MD fails is migrated to
P->RLD (`migration.rules.decide`), which needs `--migration-limit` 1 or more (the only way under `direct`). A WAN cut
takes every MD of a one-site example out; the router stays ready on P->RLD alone, and its streams in
flight go on. A peer refused service (`peers.role_lock`: it answers without the role key) is out; a
role whose every peer is refused leaves the router not ready, whatever else is in service: no request
goes to such a role, and its operator has a deployment to fix. Liveness (`GET /live`) depends on no
peer at all: the process serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.router.peers.pool import PeerPool


@dataclass(frozen=True)
class Readiness:
    ready: bool
    pipelines: list[str]  # the pipelines a request can take now
    missing: str  # what is missing for any pipeline ("" when ready)
    out: dict[str, list[str]]  # role -> the peers out of service

    def body(self) -> dict:
        body = {"status": "ready" if self.ready else "not ready", "pipelines": self.pipelines,
                "out": {r: u for r, u in self.out.items() if u}}
        if self.missing:
            body["missing"] = self.missing
        return body


def _serves(pool: PeerPool) -> bool:
    return any(not p.health.out for p in pool.peers)


def readiness(prefill: PeerPool, relay: PeerPool, main: PeerPool, migration_limit: int,
              pipeline: str = "auto") -> Readiness:
    """The pipelines open now; ready when there is one. `migration_limit`, `pipeline`: the dispatcher's;
    under `direct` with 0 no request reaches RLD alone, so RLD alone does not make the router ready."""
    p, rld, md = _serves(prefill), _serves(relay), _serves(main)
    alone = migration_limit > 0 or pipeline != "direct"  # RLD alone serves while every MD is out
    open_: list[str] = []
    if p and md:
        open_.append(Pipeline.P_MD.value)
        if rld:
            open_.append(Pipeline.P_RLD_MD.value)
    if p and rld and (md or alone):  # odd traffic with MD in service; the fallback without
        open_.append(Pipeline.P_RLD.value)
    missing = ""
    refused = [pool.role for pool in (prefill, relay, main) if pool and all(x.health.refused for x in pool.peers)]
    if refused:
        open_ = []
        missing = (f"every {' and every '.join(refused)} server is refused service: it answers its API without "
                   "the role key (start it with --api-key, or the router with --insecure-roles)")
    elif not p:
        missing = "no prefill server in service"
    elif not md and not rld:
        missing = "no main server in service, and no relay in service to serve alone"
    elif not md and not alone:
        missing = ("no main server in service, and --pipeline direct with --migration-limit 0 keeps requests "
                   "off the relay alone")
    out = {pool.role: [x.url for x in pool.out()] for pool in (prefill, relay, main) if pool}
    return Readiness(not missing, open_, missing, out)
