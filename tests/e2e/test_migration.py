"""Request migration end to end on real sglang (issue 18): a role SIGKILLed mid-stream costs no request
when a surviving server can finish it, token-identical to a single server; with --migration-limit 0 the
same kill ends the request with a clear error. The survivors' request rows go back to idle.

One P, one RLD and two MDs; router `migrating` (both MDs, --migration-limit 1) and router `limit0`
(MD 2 only, --migration-limit 0), both on P->RLD->MD. The first test kills MD 1, the second RLD."""

import json
import os
import signal
import threading
import time
import urllib.request

import pytest

from sglang_pdd.testing import identity
from sglang_pdd.testing.client import greedy_body
from sglang_pdd.testing.launch_args import PddRouterConfig
from sglang_pdd.testing.servers import http_json

from .cluster import by_state, metric, start_pdd

pytestmark = pytest.mark.e2e

BASE, BOOT, TOKEN_PORT = 31600, 8989, 18640
EAGER = 8


@pytest.fixture(scope="module")
def cluster(server_group, tiny_model):
    pdd = start_pdd(server_group, tiny_model, base_port=BASE, bootstrap_port=BOOT, token_port=TOKEN_PORT,
                    handoff_timeout=10, mains=2)
    pdd.set_knobs("relay", relay_min_eager=EAGER)
    md1, md2 = pdd.main, pdd.more_mains[0]

    def router(name, port, mains, limit):
        return server_group.start(name, PddRouterConfig(
            prefill=[(pdd.prefill.url, BOOT)], relay=[(pdd.relay.url, TOKEN_PORT)], main=[m.url for m in mains],
            tokenizer=tiny_model, port=port, pipeline="relay",
            extra=["--migration-limit", str(limit), "--health-check-s", "1"]))

    routers = {"migrating": router("pdd-router-migrating", BASE + 3, [md1, md2], 1),
               "limit0": router("pdd-router-limit0", BASE + 4, [md2], 0)}
    for r in routers.values():
        r.wait_ready()
    return {"pdd": pdd, "md1": md1, "md2": md2, **routers}


def stream(url: str, body: dict, on_chunk=None, timeout: float = 300.0) -> dict:
    """Streamed /generate through a router: the last chunk (or the error chunk), with the client's
    largest gap between two chunks (`gap_s`) and `e2e_s`; `on_chunk` sees every chunk as it comes."""
    req = urllib.request.Request(url + "/generate", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = last_t = time.monotonic()
    last, gap, seen = None, 0.0, []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            now = time.monotonic()
            gap, last_t = max(gap, now - last_t), now
            if "output_ids" in chunk:  # cumulative: each a prefix of the next (no gap, no duplicate)
                assert chunk["output_ids"][:len(seen)] == seen, "the client's stream went back"
                seen = chunk["output_ids"]
            last = chunk
            if on_chunk is not None:
                on_chunk(chunk)
    return {**last, "gap_s": gap, "e2e_s": time.monotonic() - t0, "streamed": seen}


def sigkill(server) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)


def migrations(url: str) -> dict:
    return {(dict(k)["cause"], dict(k)["outcome"]): v
            for k, v in metric(url, "sglang_pdd_router_migrations_total").items()}


def wait_idle(pdd, servers, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = {s.url: by_state(s.url, "sglang_pdd_req_rows")["free"] for s in servers}
        held = sum(sum(metric(s.url, "sglang_pdd_handoff_held_requests").values())
                   for s in servers if s is not pdd.relay)
        if (held == 0 and rows == {s.url: pdd.idle_rows[s.url] for s in servers}) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert held == 0 and rows == {s.url: pdd.idle_rows[s.url] for s in servers}, (held, rows)


def test_md_killed_after_the_handoff_goes_on_on_the_other_md(cluster, reference_server, prompts, figures):
    ids, n = prompts.ids(300, seed=200), 1500
    want = identity.reference(reference_server.url, ids, n)
    killed_at = []

    def kill_after_the_handoff(chunk):
        k = (chunk.get("meta_info") or {}).get("pdd", {}).get("handoff_tokens")
        if not killed_at and k is not None and len(chunk["output_ids"]) >= k + 16:
            killed_at.append(len(chunk["output_ids"]))
            sigkill(cluster["md1"])

    out = stream(cluster["migrating"].url, greedy_body(ids, n), kill_after_the_handoff)
    assert killed_at, "MD 1 was never killed (no handoff?)"
    assert "error" not in out, out
    identity.check(want, out["output_ids"], "migrated after MD's SIGKILL")
    pdd_meta = out["meta_info"]["pdd"]
    assert killed_at[0] < n and pdd_meta["migrations"] == 1 and pdd_meta["handoff_tokens"] >= EAGER, pdd_meta
    assert sum(v for (_, outcome), v in migrations(cluster["migrating"].url).items() if outcome == "completed") == 1
    status, health = http_json(cluster["migrating"].url + "/health")
    assert status == 200 and health["out"] == {"main": [cluster["md1"].url]}, health
    figures.append(f"migration after MD's SIGKILL at token {killed_at[0]} of {n}: largest client gap "
                   f"{out['gap_s']:.2f}s, e2e {out['e2e_s']:.1f}s ({pdd_meta['migration_causes']})")
    pdd = cluster["pdd"]
    wait_idle(pdd, [pdd.relay, cluster["md2"]])


def test_rld_killed_before_the_handoff_migrates_and_without_migration_fails_clearly(cluster, reference_server,
                                                                                    prompts, figures):
    """The same kill for two requests: the migrating router's goes on P->MD (MD held its KV), the
    other router's (--migration-limit 0) ends with a clear error."""
    pdd, n = cluster["pdd"], 600
    cases = {"migrating": prompts.ids(300, seed=201), "limit0": prompts.ids(300, seed=202)}
    want = identity.reference(reference_server.url, cases["migrating"], n)
    started = {name: threading.Event() for name in cases}
    outs = {}

    def client(name):
        def on_chunk(chunk):
            if len(chunk.get("output_ids") or []) >= 8:
                started[name].set()
        try:
            outs[name] = stream(cluster[name].url, greedy_body(cases[name], n), on_chunk)
        except Exception as e:  # noqa: BLE001 - reported below
            outs[name] = {"exception": repr(e)}
        started[name].set()

    pdd.set_knobs("relay", relay_min_eager=10 ** 6)  # no handoff: the kill lands before it
    threads = [threading.Thread(target=client, args=(name,)) for name in cases]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for e in started.values():
        assert e.wait(120)
    sigkill(pdd.relay)
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a request hung after RLD's SIGKILL"
    ok, failed = outs["migrating"], outs["limit0"]
    assert "error" not in ok and "exception" not in ok, ok
    identity.check(want, ok["output_ids"], "migrated after RLD's SIGKILL")
    assert ok["meta_info"]["pdd"]["migrations"] == 1 and ok["meta_info"]["pdd"]["handoff_tokens"] is None
    assert "error" in failed and "relay" in failed["error"]["message"], failed
    assert "127.0.0.1" not in json.dumps(failed)
    assert failed["e2e_s"] < 60
    assert sum(v for (_, o), v in migrations(cluster["limit0"].url).items() if o == "not-migrated") == 1
    figures.append(f"migration after RLD's SIGKILL before the handoff: largest client gap {ok['gap_s']:.2f}s, "
                   f"e2e {ok['e2e_s']:.1f}s; limit 0: error after {failed['e2e_s']:.1f}s "
                   f"({time.monotonic() - t0:.1f}s in all)")
    wait_idle(pdd, [cluster["md2"]])
