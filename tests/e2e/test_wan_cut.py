"""The router through a WAN cut on the netns testbed (issue 35 items 1 and 2): P, RLD, the router and the
reference server in cluster A, one MD in cluster B, the WAN between them shaped (10 ms, 200 Mbit/s) and
then cut (`lab.faults.inject`: an iptables DROP on both ends). While it is cut the router stays live
and ready (`GET /live`, `GET /ready` polled throughout), the stream MD was serving goes on on RLD
alone, token-identical to the single server, and new requests are served token-identically: the
first ones by a migration after MD's idle deadline, and once those took MD out of service, P->RLD
at once (no MD tried). After the WAN heals, MD comes back (the router's probe) and serves again;
every pool is idle afterwards. The router runs `--pipeline auto`: its pipeline policy sees peer health."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_pdd.lab.faults import inject
from sglang_pdd.lab.faults.deployment import FaultDeployment, Timeouts
from sglang_pdd.lab.faults.outcome import RequestRecord
from sglang_pdd.lab.faults.traffic import request
from sglang_pdd.lab.testbed.pytest_plugin import unique_prefix, why_no_testbed
from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.policy.pipeline import NO_MAIN
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import wait_until

pytestmark = pytest.mark.e2e

PROMPT, SHORT, LONG = 300, 48, 400  # tokens: prompts, new requests' outputs, the stream cut mid-way
# MD's idle deadline at the router: a stall this long is a failure (above MD's 5 s handoff timeout)
TIMEOUTS = Timeouts(handoff=5.0, kv=30.0, prefill_idle=60.0, relay_idle=60.0, main_idle=8.0, request=120.0)


class ProbeLog:
    """Polls the router's /live and /ready from cluster A until stopped: [(t, path, status, body)]."""

    def __init__(self, dep: FaultDeployment, every_s: float = 0.25):
        self.url, self.ns, self.every_s = dep.servers["router"].url, dep.tb.ns("A"), every_s
        self.seen: list[tuple[float, str, int | None, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-log", daemon=True)

    def _run(self) -> None:
        self.ns.enter()
        while not self._stop.is_set():
            for path in ("/live", "/ready"):
                try:
                    status, body = http_json(self.url + path, None, timeout=5.0)
                except OSError as e:  # the router did not answer at all
                    status, body = None, str(e)
                self.seen.append((time.monotonic(), path, status, body))
            self._stop.wait(self.every_s)  # the polling pace, not a wait for state

    def __enter__(self) -> "ProbeLog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def between(self, t0: float, t1: float) -> list[tuple[float, str, int | None, object]]:
        return [x for x in self.seen if t0 <= x[0] <= t1]


@pytest.fixture(scope="module")
def dep(tiny_model, artifacts_dir):
    reason = why_no_testbed()
    if reason:
        pytest.skip(reason)
    from sglang_pdd.lab.testbed import Testbed

    log_dir = os.path.join(artifacts_dir, "logs", "wan-cut-" + time.strftime("%Y%m%d-%H%M%S"))
    with Testbed(unique_prefix("wc"), delay_ms=10.0, rate_mbit=200.0) as tb:
        d = FaultDeployment(tb, tiny_model, log_dir, timeouts=TIMEOUTS, mains=1, main_tokens=8192, pipeline="auto")
        try:
            d.start()
            yield d
        finally:
            inject.heal_wan(tb)
            d.stop()


def _generate(dep, ids: list[int], n: int) -> dict:
    status, out = dep.call("router", http_json, dep.servers["router"].url + "/generate", greedy_body(ids, n), 300.0)
    assert status == 200, out
    return out


def _reference(dep, ids: list[int], n: int) -> identity.Reference:
    return dep.call("reference", identity.reference, dep.servers["reference"].url, ids, n)


def _ready(dep) -> dict:
    return dep.call("router", http_json, dep.servers["router"].url + "/ready", None, 5.0)[1]


def test_the_router_stays_ready_and_serves_through_a_wan_cut(dep, prompts):
    a = dep.tb.ns("A")
    url = dep.servers["router"].url
    rec = RequestRecord(0, 0, prompts.ids(PROMPT, seed=3500), LONG)
    fresh = [prompts.ids(PROMPT, seed=3501 + i) for i in range(4)]
    refs = {"stream": _reference(dep, rec.input_ids, LONG),
            **{i: _reference(dep, ids, SHORT) for i, ids in enumerate(fresh)}}
    moved = threading.Condition()

    def on_chunk():
        with moved:
            moved.notify_all()

    def past_md_start() -> bool:  # MD has streamed 4 tokens of it (P->MD, or past a handoff)
        return len(rec.output_ids) >= (rec.handoff_tokens or 0) + 4

    with ProbeLog(dep) as probes:
        stream = threading.Thread(target=lambda: (a.enter(), request(url, rec, 300.0, on_chunk)), daemon=True)
        stream.start()
        with moved:
            assert moved.wait_for(lambda: past_md_start() or not stream.is_alive(), 120.0)
        assert stream.is_alive() and rec.md == 0, rec  # MD's stream is in flight when the WAN goes
        t_cut = time.monotonic()
        inject.cut_wan(dep.tb)
        try:
            # new requests while MD still looks in service: each stalls past MD's idle deadline (the
            # third silent stall in a row, with the stream's, takes MD out) and migrates to RLD alone
            with ThreadPoolExecutor(2) as pool:
                first = list(pool.map(lambda ids: _generate(dep, ids, SHORT), fresh[:2]))
            stream.join(TIMEOUTS.request)
            ready = wait_until(lambda: (lambda r: r if r.get("out", {}).get("main") else None)(_ready(dep)),
                               "MD out of service at the router", 120.0, every_s=0.25)
            assert ready["status"] == "ready" and ready["pipelines"] == ["P->RLD"], ready
            alone = _generate(dep, fresh[2], SHORT)  # every MD out: P->RLD at once
            assert inject.wan_cut(dep.tb)
        finally:
            inject.heal_wan(dep.tb)
        t_heal = time.monotonic()
        # the health checker's probe generate takes MD back
        wait_until(lambda: dep.call("router", http_json, url + "/health", None, 5.0)[0] == 200, "MD back in service",
                   120.0, every_s=0.25)
        after = _generate(dep, fresh[3], SHORT)
    assert not stream.is_alive()

    # the stream in flight: finished after one migration (MD's stall) on RLD, token-identical
    assert rec.completed and not rec.went_back, rec
    identity.check(refs["stream"], rec.output_ids, "the stream cut mid-way")
    assert rec.migrations == 1 and rec.causes == ["idle"], rec
    for i, out in enumerate(first):
        identity.check(refs[i], out["output_ids"], f"new request {i} during the cut")
        meta = ReplyMeta.of(out["meta_info"])
        assert meta.migrations == 1 and meta.migration_pipelines == ["P->RLD"], meta
    meta = ReplyMeta.of(alone["meta_info"])
    identity.check(refs[2], alone["output_ids"], "new request with every MD out")
    assert (meta.pipeline, meta.reason, meta.migrations) == ("P->RLD", NO_MAIN, 0), meta
    meta = ReplyMeta.of(after["meta_info"])
    identity.check(refs[3], after["output_ids"], "after the heal")
    assert meta.migrations == 0 and (meta.pipeline == "P->MD" or meta.handoff_tokens), meta

    during = probes.between(t_cut, t_heal)
    assert len(during) >= 4 and {p for _, p, _, _ in during} == {"/live", "/ready"}
    bad = [(round(t - t_cut, 2), p, s, b) for t, p, s, b in probes.seen if s != 200]
    assert not bad, bad  # live and ready before, during and after the cut
    assert dep.leaks(150.0) == []  # RLD's and MD's rows and pools, MD's handoff table, the router's counts
