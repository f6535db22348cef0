"""Two MainDecode servers behind the PDD router, on real sglang: which one gets a request, and what
happens when a role dies mid-stream.

Choice (issue 19): the cache-aware router sends a conversation's next turn to the MD that holds its
history, so P ships only the new tokens' KV; the least-loaded router (the negative control, the old
default) sends it to the other, idler MD and P ships the whole history again. Where each turn lands is
made deterministic by blockers, long streamed requests held open: one holds an MD while turn 1
arrives, so turn 1 goes to the other (its home); the test waits until the router sees both MDs idle
(its `sglang_pdd_router_peer_load`); another holds the home MD during turn 2, so the home MD is the
busier one: the cache-aware router still picks it (the hit beats one request of load), the
least-loaded router does not. Outputs are token-identical to the single server either way.

Migration (issue 18): a role SIGKILLed mid-stream costs no request when a surviving server can finish
it, token-identical to a single server; with --migration-limit 0 the same kill ends the request with a
clear error. The survivors' request rows go back to idle.

One P, one RLD and two MDs (decode radix cache); routers `cache-aware` and `least-loaded` (both MDs,
P->MD), `migrating` (both MDs, --migration-limit 1) and `limit0` (MD 2 only, --migration-limit 0), both
on P->RLD->MD. The choice test runs first; then one test kills MD 1, the last RLD."""

import json
import os
import signal
import threading
import time

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import generate, greedy_body, sse_chunks
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import by_state, kv_bytes_per_token, kv_bytes_sent, metric, start_pdd

pytestmark = pytest.mark.e2e

BASE, BOOT, TOKEN_PORT = 31600, 8989, 18640
EAGER = 8
NEW_TOKENS = 16


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
            extra=["--migration-limit", str(limit), "--health-check-s", "1"], openai_frontend="builtin"))

    routers = {"migrating": router("pdd-router-migrating", BASE + 3, [md1, md2], 1),
               "limit0": router("pdd-router-limit0", BASE + 4, [md2], 0)}
    for i, policy in enumerate(("cache-aware", "least-loaded")):
        routers[policy] = server_group.start(f"pdd-router-{policy}", PddRouterConfig(
            prefill=[(pdd.prefill.url, BOOT)], relay=[], main=[md1.url, md2.url], tokenizer=tiny_model,
            port=BASE + 5 + i, pipeline="direct", extra=["--peer-policy", policy, "--load-poll-s", "0.2"],
            openai_frontend="builtin"))
    for r in routers.values():
        r.wait_ready()
    return {"pdd": pdd, "md1": md1, "md2": md2, **routers}


def stream(url: str, body: dict, on_chunk=None, timeout: float = 300.0) -> dict:
    """Streamed /generate through a router: the last chunk (or the error chunk), with the client's
    largest gap between two chunks (`gap_s`) and `e2e_s`; `on_chunk` sees every chunk as it comes."""
    t0 = last_t = time.monotonic()
    last, gap, seen = None, 0.0, []
    for chunk in sse_chunks(url, body, timeout):
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


def wait_unloaded(router, timeout_s: float = 60.0) -> None:
    """Until the router sees no load on any MD (its own requests and MD's polled gauges)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loads = metric(router.url, "sglang_pdd_router_peer_load")
        if loads and all(v == 0 for k, v in loads.items() if dict(k).get("role") == "main"):
            return
        time.sleep(0.1)
    raise AssertionError(f"MDs still loaded: {loads}")


class Blocker:
    """A long streamed request through the router, held open until closed."""

    def __init__(self, router, ids):
        self.chunks = sse_chunks(router.url, greedy_body(ids, 3000))
        for chunk in self.chunks:  # its first tokens: it runs on an MD now
            if "output_ids" in chunk:
                self.md = ReplyMeta.of(chunk["meta_info"]).md.index
                return
        raise AssertionError("the blocker's stream ended before any token")

    def close(self) -> None:
        self.chunks.close()  # closes the connection: the router aborts the request


def conversation(cluster, reference_server, prompts, policy: str, seed: int) -> dict:
    p, router = cluster["pdd"].prefill, cluster[policy]
    wait_unloaded(router)
    first = prompts.ids(1200, seed=seed)
    blocker = Blocker(router, prompts.ids(100, seed=seed + 1))
    try:
        out1 = generate(router.url, greedy_body(first, NEW_TOKENS))
    finally:
        blocker.close()
    home = 1 - blocker.md
    pdd1 = ReplyMeta.of(out1["meta_info"])
    assert pdd1.md.index == home, pdd1  # the other MD was busy
    identity.check(identity.reference(reference_server.url, first, NEW_TOKENS), out1["output_ids"], "turn 1")
    wait_unloaded(router)
    second = first + out1["output_ids"] + prompts.ids(100, seed=seed + 2)
    hold = Blocker(router, first[:600])  # the home MD busier than the other during turn 2
    try:
        assert hold.md == home, "the second blocker went to the MD without the conversation"
        before = kv_bytes_sent(p.url)
        out2 = generate(router.url, greedy_body(second, NEW_TOKENS))
        moved = kv_bytes_sent(p.url) - before
    finally:
        hold.close()
    identity.check(identity.reference(reference_server.url, second, NEW_TOKENS), out2["output_ids"], "turn 2")
    return {"md": ReplyMeta.of(out2["meta_info"]).md, "home": home, "moved": moved, "len": len(second),
            "cached": out2["meta_info"].get("cached_tokens")}


def test_cache_aware_keeps_the_conversation_on_its_md_least_loaded_does_not(cluster, reference_server, prompts,
                                                                            tiny_model, figures):
    kvb = kv_bytes_per_token(tiny_model)
    aware = conversation(cluster, reference_server, prompts, "cache-aware", seed=41)
    control = conversation(cluster, reference_server, prompts, "least-loaded", seed=51)
    # cache-aware: turn 2 on the MD that holds turn 1's prompt and output (but its last token's KV)
    home, away = aware["home"], 1 - aware["home"]
    assert aware["md"].index == home and "cache-aware" in aware["md"].reason
    assert aware["md"].hits[home] >= 1200 + NEW_TOKENS - 1 and aware["md"].hits[away] == 0
    assert aware["moved"] <= (aware["len"] - 1200 - NEW_TOKENS + 1) * kvb
    # least-loaded: turn 2 goes to the idler MD, whose cache has none of it: the whole history crosses again
    assert control["md"].index != control["home"], control
    assert control["moved"] >= control["len"] * kvb * 0.9
    assert aware["moved"] * 5 < control["moved"], (aware, control)
    figures.append(f"turn 2 of {aware['len']} tokens: cache-aware MD hit {aware['md'].hits[home]}, KV sent "
          f"{aware['moved'] / 2**20:.2f} MiB; least-loaded MD hit {control['md'].hits[control['md'].index]}, KV sent "
          f"{control['moved'] / 2**20:.2f} MiB ({control['moved'] / max(aware['moved'], 1):.1f}x)")
    sent = metric(cluster["cache-aware"].url, "sglang_pdd_router_md_prompt_tokens_total")
    assert sum(v for k, v in sent.items() if dict(k).get("cached") == "hit") >= 1200 + NEW_TOKENS - 1
    pdd = cluster["pdd"]
    wait_idle(pdd, [pdd.relay, cluster["md1"], cluster["md2"]])  # the blockers' rows too


def test_md_killed_after_the_handoff_goes_on_on_the_other_md(cluster, reference_server, prompts, figures):
    ids, n = prompts.ids(300, seed=200), 400  # killed some 24 tokens in: the rest is 15x that
    want = identity.reference(reference_server.url, ids, n)
    killed_at = []

    def kill_after_the_handoff(chunk):
        k = (ReplyMeta.of(chunk.get("meta_info")) or ReplyMeta()).handoff_tokens
        if not killed_at and k is not None and len(chunk["output_ids"]) >= k + 16:
            killed_at.append(len(chunk["output_ids"]))
            sigkill(cluster["md1"])

    out = stream(cluster["migrating"].url, greedy_body(ids, n), kill_after_the_handoff)
    assert killed_at, "MD 1 was never killed (no handoff?)"
    assert "error" not in out, out
    identity.check(want, out["output_ids"], "migrated after MD's SIGKILL")
    pdd_meta = ReplyMeta.of(out["meta_info"])
    assert killed_at[0] < n and pdd_meta.migrations == 1 and pdd_meta.handoff_tokens >= EAGER, pdd_meta
    # --pipeline relay: the rest went P->RLD->MD (RLD next to P streams on while MD 2 gets the KV), a second handoff
    assert pdd_meta.migration_pipelines == ["P->RLD->MD"], pdd_meta
    assert sum(v for (_, outcome), v in migrations(cluster["migrating"].url).items() if outcome == "completed") == 1
    status, health = http_json(cluster["migrating"].url + "/health")
    assert status == 200 and health["out"] == {"main": [cluster["md1"].url]}, health
    figures.append(f"migration after MD's SIGKILL at token {killed_at[0]} of {n}: largest client gap "
                   f"{out['gap_s']:.2f}s, e2e {out['e2e_s']:.1f}s ({pdd_meta.migration_causes})")
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
    ok_meta = ReplyMeta.of(ok["meta_info"])
    assert ok_meta.migrations == 1 and ok_meta.handoff_tokens is None
    assert ok_meta.migration_pipelines == ["P->MD"]  # MD held the KV
    assert "error" in failed and "relay" in failed["error"]["message"], failed
    assert "127.0.0.1" not in json.dumps(failed)
    assert failed["e2e_s"] < 60
    assert sum(v for (_, o), v in migrations(cluster["limit0"].url).items() if o == "not-migrated") == 1
    figures.append(f"migration after RLD's SIGKILL before the handoff: largest client gap {ok['gap_s']:.2f}s, "
                   f"e2e {ok['e2e_s']:.1f}s; limit 0: error after {failed['e2e_s']:.1f}s "
                   f"({time.monotonic() - t0:.1f}s in all)")
    wait_idle(pdd, [cluster["md2"]])
