"""The scenarios, in order of value: each names its fault, when it lands (a state the clients or the
router show, never a sleep), whether a surviving server can absorb it, and its traffic.

`inject(ctx)` runs while the conversations stream and returns what it did; `ctx` is a
`suite.Context` (the deployment, the testbed, the running traffic, the run's options).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from sglang_pdd.lab.faults import inject
from sglang_pdd.lab.faults.traffic import TrafficSpec

TRIGGER_S = 120.0  # the longest wait for a scenario's moment
NEVER = 10 ** 6  # relay_min_eager: RLD never answers Ready (no handoff)


class TriggerMissed(RuntimeError):
    """The moment a scenario waits for never came."""


@dataclass(frozen=True)
class Scenario:
    name: str
    inject: Callable  # (ctx) -> str
    absorbable: bool = True  # a surviving server can finish every request
    traffic: dict = field(default_factory=dict)  # TrafficSpec fields changed for this scenario
    knobs: dict = field(default_factory=dict)  # role -> test knobs for the scenario
    expected: str = ""
    restart_before_followup: bool = False  # the follow-up request needs the killed server back

    def spec(self, base: TrafficSpec) -> TrafficSpec:
        return dataclasses.replace(base, **self.traffic)


def _wait(ctx, pred, what: str):
    got = ctx.traffic.wait_for(pred, TRIGGER_S)
    if got is None:
        raise TriggerMissed(f"never saw {what}")
    return got


def _past_handoff(t):
    return next((r for r in t.active if r.handoff_tokens is not None and r.md is not None
                 and len(r.output_ids) >= r.handoff_tokens + 4), None)


def _streaming(n: int):
    return lambda t: next((r for r in t.active if len(r.output_ids) >= n and r.md is not None), None)


def md_kill_after_handoff(ctx) -> str:
    r = _wait(ctx, _past_handoff, "a request 4 tokens past its handoff")
    name = f"main-{r.md}"
    inject.sigkill(ctx.dep.servers[name])
    return f"SIGKILL {name} at token {len(r.output_ids)} of a request handed off at {r.handoff_tokens}"


def md_kill_before_handoff(ctx) -> str:
    r = _wait(ctx, _streaming(4), "a request streaming from RLD")
    name = f"main-{r.md}"
    inject.sigkill(ctx.dep.servers[name])
    return f"SIGKILL {name} while its requests stream from RLD (relay_min_eager={NEVER}: no handoff)"


def rld_kill_mid_stream(ctx) -> str:
    r = _wait(ctx, _streaming(8), "a request 8 tokens into RLD's stream")
    inject.sigkill(ctx.dep.servers["relay"])
    return f"SIGKILL relay at token {len(r.output_ids)} (no handoff: relay_min_eager={NEVER})"


def _cut(ctx, seconds: float, what: str) -> str:
    r = _wait(ctx, _streaming(1), "a request's first token (MD's KV on the WAN)")
    inject.cut_wan(ctx.tb)
    try:
        time.sleep(seconds)  # the fault's own length, not a wait for state
    finally:
        inject.heal_wan(ctx.tb)
    return f"{what}: iptables DROP on both wan0 for {seconds:g}s from token {len(r.output_ids)} of a request"


def wan_cut_short(ctx) -> str:
    return _cut(ctx, 5.0, "WAN cut")


def wan_cut_long(ctx) -> str:
    return _cut(ctx, ctx.opts.long_cut_s, "WAN cut")


def wan_cut_after_handoff(ctx) -> str:
    """Past MD's idle deadline: the router must move the requests MD streams (the other MD is behind
    the same cut)."""
    r = _wait(ctx, _past_handoff, "a request 4 tokens past its handoff")
    seconds = ctx.dep.timeouts.main_idle + 10
    inject.cut_wan(ctx.tb)
    try:
        time.sleep(seconds)  # the fault's own length
    finally:
        inject.heal_wan(ctx.tb)
    return (f"iptables DROP on both wan0 for {seconds:g}s (MD's idle deadline + 10 s) from token "
            f"{len(r.output_ids)} of a request handed off at {r.handoff_tokens}")


def wan_flap(ctx) -> str:
    _wait(ctx, _streaming(1), "a request's first token")
    n, down, up = 6, 1.5, 1.5
    for _ in range(n):
        inject.cut_wan(ctx.tb)
        time.sleep(down)
        inject.heal_wan(ctx.tb)
        time.sleep(up)
    return f"WAN flapping: {n} x ({down:g}s down, {up:g}s up)"


def md_restart(ctx) -> str:
    r = _wait(ctx, _past_handoff, "a request 4 tokens past its handoff")
    name = f"main-{r.md}"
    ctx.dep.servers[name].stop()  # SIGTERM: a planned restart
    ctx.dep.restart(name)
    return f"SIGTERM {name} at token {len(r.output_ids)} (past its handoff), started again at once"


def p_kill_mid_prefill(ctx) -> str:
    n = ctx.traffic.spec.conversations
    _wait(ctx, lambda t: len(t.active) == n and t.streamed() == 0 or None, "every first turn sent, no token yet")
    deadline = time.monotonic() + TRIGGER_S
    while True:  # P has the requests (the router's in-flight count)
        busy = sum(v for k, v in ctx.dep.metric("router", "sglang_pdd_router_peer_in_flight").items()
                   if dict(k).get("role") == "prefill")
        if busy:
            break
        if time.monotonic() > deadline:
            raise TriggerMissed("never saw a request on P")
        time.sleep(0.05)
    inject.sigkill(ctx.dep.servers["prefill"])
    return f"SIGKILL prefill with {busy:g} requests on it, before any token (the only P)"


def router_restart(ctx) -> str:
    r = _wait(ctx, _streaming(4), "a request streaming")
    inject.sigkill(ctx.dep.servers["router"])
    ctx.dep.restart("router")
    return f"SIGKILL router at token {len(r.output_ids)}, started again at once"


def md_pool_exhausted(ctx) -> str:
    _wait(ctx, lambda t: t.streamed() > 0 or not t.running or None, "a token")
    return (f"MD's KV pool {ctx.dep.main_tokens} tokens; one prompt of {ctx.traffic.spec.big_prompt} tokens and "
            f"{ctx.traffic.spec.conversations - 1} of {ctx.traffic.spec.first_prompt} at once")


def rld_overloaded(ctx) -> str:
    ctx.traffic.wait_for(lambda t: not t.running, ctx.traffic.spec.deadline_s)
    longest = max((r.e2e_s for r in ctx.traffic.records), default=0.0)
    return (f"RLD never hands off (relay_min_eager={NEVER}); MD's handoff timeout "
            f"{ctx.dep.timeouts.handoff:g}s, the longest request {longest:.1f}s")


def idle_then_traffic(ctx) -> str:
    return ctx.idle_note  # the idle and the flush come before the traffic (suite.before_traffic)


SCENARIOS = [
    Scenario("md-kill-after-handoff", md_kill_after_handoff,
             expected="requests on the dead MD migrate to the other MD: token-identical"),
    Scenario("md-kill-before-handoff", md_kill_before_handoff, knobs={"relay": {"relay_min_eager": NEVER}},
             expected="RLD gets no Ready and decodes to the end: token-identical, no migration"),
    Scenario("rld-kill-mid-stream", rld_kill_mid_stream, knobs={"relay": {"relay_min_eager": NEVER}},
             expected="requests migrate P->MD (MD holds their KV): token-identical"),
    Scenario("wan-cut-5s", wan_cut_short, expected="TCP rides it out; RLD streams meanwhile: token-identical"),
    Scenario("wan-cut-long", wan_cut_long,
             expected="MD's handoff times out, RLD decodes to the end; or the router migrates: token-identical"),
    Scenario("wan-cut-after-handoff", wan_cut_after_handoff,
             expected="the requests MD streams stall past the router's idle deadline and go on P->RLD: "
                      "token-identical"),
    Scenario("wan-flap", wan_flap, expected="token-identical (some after migration)"),
    Scenario("md-restart", md_restart, expected="requests on the restarted MD migrate: token-identical"),
    Scenario("p-kill-mid-prefill", p_kill_mid_prefill, absorbable=False, traffic={"first_prompt": 2000, "turns": 2},
             restart_before_followup=True,
             expected="the only P: a clear error in bounded time"),
    Scenario("router-restart-mid-stream", router_restart, absorbable=False,
             expected="the clients' connections die (clear error); the restarted router serves"),
    Scenario("md-pool-exhausted", md_pool_exhausted, absorbable=False,
             traffic={"first_prompt": 2500, "big_prompt": 10000, "turns": 1},
             expected="served (RLD finishes what MD cannot take) or a clear error; never a hang or a leak"),
    Scenario("rld-overloaded", rld_overloaded, knobs={"relay": {"relay_min_eager": NEVER}},
             traffic={"max_new_tokens": 400, "turns": 1},
             expected="MD's handoff times out, RLD decodes to the end: token-identical"),
    Scenario("idle-then-traffic", idle_then_traffic, expected="token-identical"),
]
BY_NAME = {s.name: s for s in SCENARIOS}


def parse(spec: str | None) -> list[Scenario]:
    """'a,b' -> those scenarios in that order; None or 'all': every one, in the suite's order."""
    if not spec or spec == "all":
        return list(SCENARIOS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(BY_NAME)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a scenario is listed twice: {spec!r}")
    return [BY_NAME[n] for n in names]
