"""One request's record: each try at it (`Attempt`) and what the dispatcher learned (`Outcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.router.peers.placement import MainChoice
from sglang_pdd.router.peers.pool import Peer


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
    handoff_tokens: int | None = None
    handoff_mode: str | None = None
    output_logprobs: list | None = None
    live_logprobs: list | None = None  # the client's tokens' logprobs so far, aligned with its tokens
    md_hit: int | None = None  # prompt tokens the router saw in MD's cache at the decision
    missed_bytes: int | None = None  # MD's predicted missed KV bytes (what P->MD would send over the WAN)
    predicted_wan_s: float | None = None
    placement: str = ""  # with a TTFT SLA: where the policy put the relay (none, p, pool)
    rule: str = ""  # with a TTFT SLA: the rule that decided (policy.relay_placement.RULES)
    rld_in_flight: int | None = None  # requests in flight on the chosen relay at the decision
    relay_target: str | None = None  # who relayed it: "relay" (an RLD) or "prefill" (P itself, --pdd-relay local)
    main_choice: MainChoice | None = None  # which MD, and what the choice saw
    migrations: list[str] = field(default_factory=list)  # the cause of each migration, in order
    migration_pipelines: list[str] = field(default_factory=list)  # the pipeline each migration took
    unmigrated: str | None = None  # the cause of the failure that ended the request unmigrated
