"""The packed WAN path on real sglang and Mooncake: MD offers landing regions, P packs each chunk into a
few large writes, MD unpacks on success. Token identity against a single server is the proof; P's and
MD's counters show the packed path was taken; MD skipping the unpack is the negative control."""

import json
import os
import time

import pytest

from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.testing.client import greedy_body, greedy_ids, pd_generate
from sglang_pdd.testing.pdd_client import Roles, relayed_generate

from .cluster import metric, start_pdd

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18520
PAGE = 16
NEW = 24
KNOBS: dict[str, str] = {}


def set_knobs(role: str, **knobs) -> None:
    with open(KNOBS[role] + ".tmp", "w") as f:
        json.dump(knobs, f)
    os.replace(KNOBS[role] + ".tmp", KNOBS[role])


@pytest.fixture(scope="module")
def packed(server_group, tiny_model, log_dir):
    for role in ("prefill", "main"):
        KNOBS[role] = os.path.join(log_dir, f"packed-wan-{role}-knobs.json")
        set_knobs(role)
    flags = ("--pdd-packed-wan", "plain")
    s = start_pdd(server_group, tiny_model, base_port=31100, bootstrap_port=8993, token_port=TOKEN_PORT,
                  handoff_timeout=20, page_size=PAGE, prefill_extra=flags, main_extra=flags,
                  prefill_env={ENV_TEST_KNOBS: KNOBS["prefill"]}, main_env={ENV_TEST_KNOBS: KNOBS["main"]})
    return Roles(prefill=s.prefill.url, relay=s.relay.url, main=s.main.url, bootstrap_host="127.0.0.1",
                 bootstrap_port=s.bootstrap_port, token_channel=f"tcp://127.0.0.1:{TOKEN_PORT}")


@pytest.fixture(autouse=True)
def _reset_knobs(packed):
    yield
    set_knobs("prefill")
    set_knobs("main")


def events(url: str, side: str) -> dict[str, float]:
    return {dict(k)["event"]: v for k, v in metric(url, "sglang_pdd_packed_wan_events_total").items()
            if dict(k).get("side") == side}


def landing(url: str) -> dict[str, float]:
    return {dict(k)["what"]: v for k, v in metric(url, "sglang_pdd_packed_wan_landing").items()}


def kv_slices(url: str) -> float:
    return sum(v for k, v in metric(url, "sglang_pdd_transfer_slices_total").items() if dict(k).get("kind") == "kv")


def delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_plain_pd_to_main_goes_packed_and_is_token_identical(packed, reference_server, prompts):
    ids = prompts.ids(900, seed=701)
    p0, m0, s0 = events(packed.prefill, "prefill"), events(packed.main, "main"), kv_slices(packed.prefill)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    assert out["output_ids"] == greedy_ids(reference_server.url, ids, NEW)
    p1, m1 = events(packed.prefill, "prefill"), events(packed.main, "main")
    assert delta(p1, p0, "packed") >= 1, p1
    # one block per chunk here, written as two slices (the block and its table entry), all layers at once
    assert kv_slices(packed.prefill) - s0 == 2 * delta(p1, p0, "packed")
    assert delta(m1, m0, "offered") == 1 and delta(m1, m0, "unpacked") == 1, m1
    assert not [e for e in p1 if e.startswith("page by page") and delta(p1, p0, e)], p1


def test_fanout_main_leg_goes_packed_across_a_conversation(packed, reference_server, prompts):
    """Turn 2 extends turn 1: MD caches turn 1, so its leg is trimmed to the new pages, still packed."""
    turn1 = prompts.ids(700, seed=702)
    r1 = relayed_generate(packed, greedy_body(turn1, NEW), fanout=True, main_delay_s=0.3)
    assert r1.tokens == greedy_ids(reference_server.url, turn1, NEW)
    turn2 = turn1 + r1.tokens + prompts.ids(300, seed=703)
    m0 = events(packed.main, "main")
    r2 = relayed_generate(packed, greedy_body(turn2, NEW), fanout=True, main_delay_s=0.3)
    assert r2.tokens == greedy_ids(reference_server.url, turn2, NEW)
    # RLD may have finished turn 2 itself: MD then keeps landing its KV after its reply (--pdd-relay-finished-kv keep)
    deadline = time.monotonic() + 30
    while delta(events(packed.main, "main"), m0, "unpacked") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    m1 = events(packed.main, "main")
    assert delta(m1, m0, "unpacked") == 1, m1


def test_blocks_smaller_than_a_chunk_are_reassembled(packed, reference_server, prompts):
    """P's staging capped at one page: every chunk goes as many blocks, each with its table entry."""
    set_knobs("prefill", packed_staging_bytes=1)
    ids = prompts.ids(500, seed=704)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    assert out["output_ids"] == greedy_ids(reference_server.url, ids, NEW)


def test_concurrent_relayed_requests_each_land_in_their_own_region(packed, reference_server, prompts):
    import concurrent.futures as cf

    seqs = [prompts.ids(400 + 150 * i, seed=710 + i) for i in range(3)]
    with cf.ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda s: relayed_generate(packed, greedy_body(s, NEW), fanout=True,
                                                         main_delay_s=0.3), seqs))
    for s, r in zip(seqs, results):
        assert r.tokens == greedy_ids(reference_server.url, s, NEW)


def test_negative_control_main_without_the_unpack_diverges(packed, reference_server, prompts):
    """MD leaves P's blocks in the landing region: its pages hold no KV, so its output must differ."""
    set_knobs("main", packed_skip_unpack=True)
    ids = prompts.ids(900, seed=705)
    p0 = events(packed.prefill, "prefill")
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    assert delta(events(packed.prefill, "prefill"), p0, "packed") >= 1
    assert out["output_ids"] != greedy_ids(reference_server.url, ids, NEW)


def test_landing_arena_is_empty_when_idle(packed):
    deadline = time.monotonic() + 30  # a room RLD finished may still be landing on MD
    while landing(packed.main).get("rooms") and time.monotonic() < deadline:
        time.sleep(0.2)
    got = landing(packed.main)
    assert got.get("rooms") == 0 and got.get("bytes") == 0 and got.get("quarantined") == 0, got


def test_main_aborted_mid_transfer_quarantines_its_region(packed, reference_server, prompts):
    """Last: P holds the main leg's write back (knob), MD aborts the request meanwhile. Its region is
    quarantined (P might still write into it), nothing else is held, and MD goes on serving."""
    import random
    import threading

    from sglang_pdd.testing.client import generate
    from sglang_pdd.testing.servers import http_json

    set_knobs("prefill", main_write_delay=3.0)
    ids = prompts.ids(600, seed=706)
    room, room2 = random.getrandbits(63), random.getrandbits(63)
    body = {**greedy_body(ids, NEW), "bootstrap_host": packed.bootstrap_host, "bootstrap_port": packed.bootstrap_port}
    to_p = {**body, "bootstrap_room": room,
            "sampling_params": {**body["sampling_params"], "custom_params": {"pdd": {"v": 1, "main_room": room2}}}}
    results: dict = {}

    def call(name, url, b):
        try:
            results[name] = generate(url, b)
        except Exception as e:  # inspected below
            results[name] = e

    threads = [threading.Thread(target=call, args=a) for a in (
        ("prefill", packed.prefill, to_p), ("relay", packed.relay, {**body, "bootstrap_room": room}),
        ("main", packed.main, {**body, "bootstrap_room": room2, "rid": f"packed-abort-{room2}"}))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while landing(packed.main).get("rooms", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert landing(packed.main).get("rooms") == 1
    http_json(packed.main + "/abort_request", {"rid": f"packed-abort-{room2}"})
    for t in threads:
        t.join()
    assert results["relay"]["output_ids"] == greedy_ids(reference_server.url, ids, NEW)
    got = landing(packed.main)
    assert got.get("rooms") == 0 and got.get("quarantined") == 1, got
    set_knobs("prefill")
    again = prompts.ids(400, seed=707)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(again, NEW))
    assert out["output_ids"] == greedy_ids(reference_server.url, again, NEW)
