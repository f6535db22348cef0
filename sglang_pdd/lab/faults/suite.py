"""Runs scenarios on one deployment: for each, a healthy idle start, the traffic, the fault, the
recovery (the WAN healed, killed servers started again), the leak check, one follow-up request, then
every request classified against the single server's tokens.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from sglang_pdd.lab.faults import inject
from sglang_pdd.lab.faults.deployment import FaultDeployment
from sglang_pdd.lab.faults.outcome import RequestRecord, classify, matches
from sglang_pdd.lab.faults.report import ScenarioReport
from sglang_pdd.lab.faults.scenarios import Scenario, TriggerMissed
from sglang_pdd.lab.faults.traffic import Traffic, TrafficSpec, request

logger = logging.getLogger(__name__)


@dataclass
class Options:
    concurrency: int = 4
    turns: int = 3
    long_cut_s: float = 90.0
    idle_s: float = 600.0
    # the router's copies left to land MD's KV end within its request timeout (240 s): a leak is
    # what is still there after it
    leak_wait_s: float = 250.0
    deadline_s: float = 300.0  # the client's deadline per request


@dataclass
class Context:
    dep: FaultDeployment
    tb: object
    traffic: Traffic
    opts: Options
    idle_note: str = ""


def before_traffic(scenario: Scenario, dep: FaultDeployment, opts: Options) -> str:
    if scenario.name != "idle-then-traffic":
        return ""
    time.sleep(opts.idle_s)  # the fault is the idle itself
    return f"{opts.idle_s:g}s idle, then {inject.flush_conntrack(dep.tb)}, then traffic"


def recover(dep: FaultDeployment, restart: bool = True) -> None:
    """The WAN healed, the knobs off and (`restart`) every killed server started again; waits on
    /health of every live server."""
    inject.heal_wan(dep.tb)
    for role in dep.knob_files:
        dep.set_knobs(role)
    for name, s in list(dep.servers.items()):
        if restart and not s.alive():
            dep.restart(name)
    dep.healthy(240.0, router=restart)


def run_scenario(scenario: Scenario, dep: FaultDeployment, prompts, opts: Options, seed: int) -> ScenarioReport:
    rep = ScenarioReport(scenario.name, scenario.absorbable)
    recover(dep)
    left = dep.leaks(opts.leak_wait_s)
    if left:  # the last scenario's leak is not this one's
        logger.warning("%s starts with %s", scenario.name, left)
    for role, knobs in scenario.knobs.items():
        dep.set_knobs(role, **knobs)
    a = dep.tb.ns("A")
    spec = scenario.spec(TrafficSpec(conversations=opts.concurrency, turns=opts.turns, deadline_s=opts.deadline_s,
                                     seed=seed))
    idle_note = before_traffic(scenario, dep, opts)
    router = dep.servers["router"]
    before = dep.migrations()
    traffic = Traffic(router.url, spec, prompts, a).start()
    ctx = Context(dep, dep.tb, traffic, opts, idle_note)
    restarted_router = scenario.name.startswith("router-")
    try:
        rep.injected = scenario.inject(ctx)
    except TriggerMissed as e:
        rep.harness_error = str(e)
    finally:
        inject.heal_wan(dep.tb)
    traffic.join(spec.deadline_s * spec.turns + 60)
    rep.leaked = dep.leaks(opts.leak_wait_s)  # on the servers that survived
    after = dep.migrations() if dep.servers["router"].alive() else {}
    rep.migrations = {k: v - (0 if restarted_router else before.get(k, 0)) for k, v in after.items()
                      if v - (0 if restarted_router else before.get(k, 0))}
    # the survivors serve the follow-up; a killed server comes back before the next scenario
    recover(dep, restart=scenario.restart_before_followup)
    follow = RequestRecord(-1, 0, prompts.ids(spec.first_prompt, seed=seed * 1000 + 999), spec.max_new_tokens)
    a.call(request, dep.servers["router"].url, follow, spec.deadline_s)
    records = traffic.records + [follow]
    classify_all(rep, records, dep)
    logger.info("%s: %s", scenario.name, rep.counts)
    return rep


def classify_all(rep: ScenarioReport, records: list[RequestRecord], dep: FaultDeployment) -> None:
    from sglang_pdd.lab.testing import identity

    ref_url = dep.servers["reference"].url
    migrated, others = [], []
    for r in records:
        same = None
        if r.completed and not r.went_back:
            ref = dep.call("reference", identity.reference, ref_url, r.input_ids, r.max_new_tokens, **r.sampling)
            same = matches(ref, r.output_ids)
            if not same:
                i = identity.first_divergence(ref.tokens, r.output_ids)
                rep.wrong.append(f"conv {r.conv} turn {r.turn}{' (seeded)' if r.sampling else ''}: diverges at step {i} "
                                 f"(migrations {r.migrations}, md {r.md}, handoff {r.handoff_tokens})")
        cls = classify(r, same)
        rep.add(cls, seeded=bool(r.sampling))
        if cls == "failed" and r.error not in rep.errors:
            rep.errors.append(r.error)
        (migrated if cls == "migrated" else others if cls == "identical" else []).append(r)
    rep.timing(migrated, others)


def run_suite(scenarios: list[Scenario], dep: FaultDeployment, prompts, opts: Options) -> list[ScenarioReport]:
    reports = []
    for i, s in enumerate(scenarios):
        logger.info("scenario %s", s.name)
        try:
            reports.append(run_scenario(s, dep, prompts, opts, seed=i + 1))
        except Exception as e:  # one scenario's harness failure must not lose the others
            logger.exception("scenario %s failed to run", s.name)
            rep = ScenarioReport(s.name, s.absorbable)
            rep.harness_error = f"{type(e).__name__}: {e}"
            reports.append(rep)
    return reports


def run(scenarios, opts: Options, artifacts: str, prefix: str, delay_ms: float = 10.0, rate_mbit: float = 200.0):
    """The testbed and the deployment up, the scenarios run, everything down; (reports, run info)."""
    from sglang_pdd.lab.faults.deployment import FaultDeployment
    from sglang_pdd.lab.testbed import Testbed
    from sglang_pdd.lab.testing.prompts import PromptMaker
    from sglang_pdd.lab.testing.tiny_model import build_cached

    model = build_cached(os.path.join(artifacts, "models"))
    log_dir = os.path.join(artifacts, "logs", "faults-" + time.strftime("%Y%m%d-%H%M%S"))
    t0 = time.monotonic()
    with Testbed(prefix, delay_ms=delay_ms, rate_mbit=rate_mbit) as tb:
        dep = FaultDeployment(tb, model, log_dir, main_tokens=8192)
        try:
            dep.start()
            logger.info("deployment up in %.0fs (logs %s)", time.monotonic() - t0, log_dir)
            reports = run_suite(scenarios, dep, PromptMaker(model), opts)
        finally:
            dep.stop()
    info = {"options": vars(opts), "wan": {"delay_ms": delay_ms, "rate_mbit": rate_mbit}, "log_dir": log_dir,
            "runtime_s": round(time.monotonic() - t0, 1)}
    return reports, info
