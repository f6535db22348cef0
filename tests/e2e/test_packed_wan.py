"""The packed WAN path on real sglang and Mooncake: MD offers landing regions, P packs each chunk into a
few large writes, MD unpacks on success. Token identity against a single server is the proof; P's and
MD's counters show the packed path was taken; MD skipping the unpack is the negative control."""

import time

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, pd_generate
from sglang_pdd.lab.testing.pdd_client import relayed_generate, relayed_generate_many

from .cluster import kv_bytes_per_token, metric, start_pdd

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18520
PAGE = 16
BLOCK_PAGES = 16  # P's largest packed block (--pdd-packed-staging-bytes): a longer chunk goes as several blocks
NEW = 24
RELAYED_NEW = 160  # relayed requests: long enough that RLD hands over (at k >= 4, its knob) before it ends
SERVERS = {}


def set_knobs(role: str, **knobs) -> None:
    SERVERS["pdd"].set_knobs(role, **knobs)


@pytest.fixture(scope="module")
def packed(server_group, tiny_model):
    """P packs blocks of at most BLOCK_PAGES pages (`--pdd-packed-staging-bytes`): a prompt of up to 256 tokens
    goes as one block, a longer one as several (a block smaller than a page, one page each, is the unit
    tests', tests/unit/transfer/test_packed_wan.py)."""
    flags = ("--pdd-packed-wan", "plain")
    staging = (BLOCK_PAGES * PAGE + PAGE // 2) * kv_bytes_per_token(tiny_model)  # half a page spare: 16 pages a block
    s = start_pdd(server_group, tiny_model, base_port=31100, bootstrap_port=8993, token_port=TOKEN_PORT,
                  handoff_timeout=20, page_size=PAGE, main_extra=flags,
                  prefill_extra=(*flags, "--pdd-packed-staging-bytes", str(staging)))
    s.set_knobs("relay", relay_min_eager=4)
    SERVERS["pdd"] = s
    return s.roles


@pytest.fixture(autouse=True)
def _reset_knobs(request):
    yield
    if "packed" in request.fixturenames:
        set_knobs("prefill")
        set_knobs("main")


def ref(reference_server, ids, n=NEW) -> identity.Reference:
    return identity.reference(reference_server.url, ids, n)


def assert_main_identical(want, r, what: str) -> None:
    """A relayed request handed over (k >= 4) and MD's own tokens, after its packed leg, are the reference's."""
    assert r.handed_over and r.k >= 4, (r.k, r.relay["meta_info"]["finish_reason"])
    identity.check(want, r.main["output_ids"], f"{what}: MD after its packed fan-out leg")


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
    ids = prompts.ids(250, seed=701)  # 16 pages: one block
    p0, m0, s0 = events(packed.prefill, "prefill"), events(packed.main, "main"), kv_slices(packed.prefill)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    identity.check(ref(reference_server, ids), out["output_ids"], "packed P->MD")
    p1, m1 = events(packed.prefill, "prefill"), events(packed.main, "main")
    assert delta(p1, p0, "packed") >= 1, p1
    # one block per chunk here, written as two slices (the block and its table entry), all layers at once
    assert kv_slices(packed.prefill) - s0 == 2 * delta(p1, p0, "packed")
    assert delta(m1, m0, "offered") == 1 and delta(m1, m0, "unpacked") == 1, m1
    assert not [e for e in p1 if e.startswith("page by page") and delta(p1, p0, e)], p1


def test_fanout_main_leg_goes_packed_across_a_conversation(packed, reference_server, prompts):
    """Turn 2 extends turn 1: MD caches turn 1, so its leg is trimmed to the new pages, still packed."""
    turn1 = prompts.ids(700, seed=702)
    m0 = events(packed.main, "main")
    r1 = relayed_generate(packed, greedy_body(turn1, RELAYED_NEW), fanout=True)
    assert_main_identical(ref(reference_server, turn1, RELAYED_NEW), r1, "turn 1")
    turn2 = turn1 + r1.tokens + prompts.ids(300, seed=703)
    m1 = events(packed.main, "main")
    r2 = relayed_generate(packed, greedy_body(turn2, RELAYED_NEW), fanout=True)
    assert_main_identical(ref(reference_server, turn2, RELAYED_NEW), r2, "turn 2")
    m2 = events(packed.main, "main")
    assert delta(m1, m0, "unpacked") == 1 and delta(m2, m1, "unpacked") == 1, (m0, m1, m2)
    assert r2.main["meta_info"]["cached_tokens"] >= len(turn1) // PAGE * PAGE


def test_blocks_smaller_than_a_chunk_are_reassembled(packed, reference_server, prompts):
    """A chunk longer than P's staging goes as several blocks, each with its table entry; MD puts them
    together (a 900-token prompt, one chunk of 57 pages: blocks of 16, 16, 16 and 9 pages)."""
    ids = prompts.ids(900, seed=704)
    p0, m0, s0 = events(packed.prefill, "prefill"), events(packed.main, "main"), kv_slices(packed.prefill)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    identity.check(ref(reference_server, ids), out["output_ids"], "blocks smaller than a chunk")
    p1, m1 = events(packed.prefill, "prefill"), events(packed.main, "main")
    assert delta(p1, p0, "packed") == 1, p1  # one chunk (no chunked prefill)
    assert kv_slices(packed.prefill) - s0 == 2 * -(-len(ids) // (BLOCK_PAGES * PAGE))  # 4 blocks, 2 slices each
    assert delta(m1, m0, "offered") == 1 and delta(m1, m0, "unpacked") == 1, m1


def test_concurrent_relayed_requests_each_land_in_their_own_region(packed, reference_server, prompts):
    """Three relayed requests at once: three regions offered and unpacked, each MD's tokens its own."""
    seqs = [prompts.ids(400 + 150 * i, seed=710 + i) for i in range(3)]
    m0 = events(packed.main, "main")
    results = relayed_generate_many(packed, [greedy_body(s, RELAYED_NEW) for s in seqs], fanout=True)
    for s, r in zip(seqs, results):
        assert_main_identical(ref(reference_server, s, RELAYED_NEW), r, "concurrent")
    m1 = events(packed.main, "main")
    assert delta(m1, m0, "offered") == 3 and delta(m1, m0, "unpacked") == 3, (m0, m1)


def test_negative_control_main_without_the_unpack_diverges(packed, reference_server, prompts):
    """MD leaves P's blocks in the landing region: its pages hold no KV, so its output must differ."""
    set_knobs("main", packed_skip_unpack=True)
    ids = prompts.ids(900, seed=705)
    p0 = events(packed.prefill, "prefill")
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(ids, NEW))
    assert delta(events(packed.prefill, "prefill"), p0, "packed") >= 1
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(ref(reference_server, ids), out["output_ids"], "packed control")


def test_negative_control_the_fanout_leg_without_the_unpack_diverges(packed, reference_server, prompts):
    """The same control on a relayed request's packed fan-out leg: RLD's eager tokens are right, MD's
    continuation over its unfilled pages is not."""
    set_knobs("main", packed_skip_unpack=True)
    ids = prompts.ids(800, seed=708)
    want = ref(reference_server, ids, RELAYED_NEW)
    r = relayed_generate(packed, greedy_body(ids, RELAYED_NEW), fanout=True)
    identity.check(want, r.relay["output_ids"], "RLD's eager tokens", prefix=True)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_main_identical(want, r, "fan-out control")


def test_landing_arena_is_empty_when_idle(packed):
    deadline = time.monotonic() + 30  # a room RLD finished may still be landing on MD
    while landing(packed.main).get("rooms") and time.monotonic() < deadline:
        time.sleep(0.2)
    got = landing(packed.main)
    assert got.get("rooms") == 0 and got.get("bytes") == 0 and got.get("quarantined") == 0, got


def test_main_aborted_mid_transfer_quarantines_its_region(packed, reference_server, prompts):
    """Last: P holds the main leg's write back (knob), MD aborts the request meanwhile. Its region is
    quarantined (P might still write into it), nothing else is held, and MD goes on serving."""
    import threading

    from sglang_pdd.policy.pipeline import Pipeline
    from sglang_pdd.protocol import room_plan
    from sglang_pdd.lab.testing.pdd_client import signer_from_env
    from sglang_pdd.lab.testing.client import generate
    from sglang_pdd.lab.testing.servers import http_json

    set_knobs("prefill", main_write_delay=3.0)
    ids = prompts.ids(600, seed=706)
    # the fan-out alone: MD is told of no relay (no token channel)
    plan = room_plan.plan(greedy_body(ids, NEW), Pipeline.P_RLD_MD, packed.bootstrap_host, packed.bootstrap_port,
                          signer=signer_from_env())
    main_rid = f"packed-abort-{plan.main_room}"
    results: dict = {}

    def call(name, url, b):
        try:
            results[name] = generate(url, b)
        except Exception as e:  # inspected below
            results[name] = e

    threads = [threading.Thread(target=call, args=a) for a in (
        ("prefill", packed.prefill, plan.bodies["prefill"]), ("relay", packed.relay, plan.bodies["relay"]),
        ("main", packed.main, {**plan.bodies["main"], "rid": main_rid}))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while landing(packed.main).get("rooms", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert landing(packed.main).get("rooms") == 1
    http_json(packed.main + "/abort_request", {"rid": main_rid})
    for t in threads:
        t.join()
    identity.check(ref(reference_server, ids), results["relay"]["output_ids"], "the relay, its main aborted")
    got = landing(packed.main)
    assert got.get("rooms") == 0 and got.get("quarantined") == 1, got
    set_knobs("prefill")
    again = prompts.ids(400, seed=707)
    out = pd_generate(packed.prefill, packed.main, packed.bootstrap_host, packed.bootstrap_port, greedy_body(again, NEW))
    identity.check(ref(reference_server, again), out["output_ids"], "after the abort")
