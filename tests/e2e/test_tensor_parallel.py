"""TP 2 on every role (CPU, gloo; each server's two ranks bound to cores 0 and 1), RLD and MD on sglang's
overlap scheduler (a GPU deployment's defaults): P's fan-out sends each rank's KV shard to the same rank
of RLD and MD; on RLD and MD rank 0 decides and rank 1 replays its
decisions (sglang_pdd.decode.rank_sync): the handoff finish on RLD, holding, aborting and the handoff or
catch-up EXTEND over RLD's token IDs on MD, so both ranks build the same batches. Tokens equal a
single server's (TP 1), with a negative control that fails."""

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.pdd_client import relayed_generate, relayed_generate_many

from .cluster import abort_while_held, assert_handoff_identical, assert_tp, decode_roles_idle, relayed_at, start_pdd

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18650
PAGE = 16
NEW = 48


@pytest.fixture(scope="module")
def pdd(server_group, tiny_model):
    pdd = start_pdd(server_group, tiny_model, base_port=31400, bootstrap_port=8990, token_port=TOKEN_PORT,
                    handoff_timeout=30, page_size=PAGE, tp=2, decode_overlap=True)
    assert_tp(pdd, 2)
    return pdd


def ref(reference_server, ids, n=NEW, **sp) -> identity.Reference:
    return identity.reference(reference_server.url, ids, n, **sp)


def relayed(pdd, body, k, **kw):
    return relayed_at(pdd, body, k, main_first=not kw.get("fanout"), **kw)


def test_one_shot_handoff_is_token_identical(pdd, reference_server, prompts):
    ids = prompts.ids(300, seed=1401)
    r = relayed(pdd, greedy_body(ids, NEW), k=5)
    assert r.k == 5
    assert_handoff_identical(ref(reference_server, ids), r, "TP 2 one-shot")


def test_fan_out_sends_each_rank_its_shard_and_the_handoff_is_identical(pdd, reference_server, prompts):
    """P's fan-out feeds RLD and MD rank to rank (page by page: the packed WAN path is refused at TP > 1);
    turn 2 sends MD only the pages its radix cache lacks."""
    first = prompts.ids(500, seed=1402)
    r1 = relayed(pdd, greedy_body(first, 24), k=3, fanout=True)
    assert_handoff_identical(ref(reference_server, first, 24), r1, "TP 2 fan-out, turn 1")
    second = first + r1.tokens + prompts.ids(60, seed=1403)
    r2 = relayed(pdd, greedy_body(second, NEW), k=4, fanout=True)
    assert_handoff_identical(ref(reference_server, second), r2, "TP 2 fan-out, turn 2")
    assert r2.main["meta_info"]["cached_tokens"] >= len(first) // PAGE * PAGE


def test_catch_up_and_concurrent_handoffs(pdd, reference_server, prompts):
    ids = prompts.ids(250, seed=1404)
    with pdd.knobs("relay", relay_min_eager=12):
        r = relayed_generate(pdd.roles, greedy_body(ids, 200), main_extra={"handoff": "catch-up", "chunk": 4})
    assert r.handed_over and r.k >= 12
    assert_handoff_identical(ref(reference_server, ids, 200), r, "TP 2 catch-up")
    cases = [prompts.ids(150 + 40 * i, seed=1410 + i) for i in range(3)]
    with pdd.knobs("relay", relay_min_eager=3):
        out = relayed_generate_many(pdd.roles, [greedy_body(c, NEW) for c in cases], main_first=True)
    for c, r in zip(cases, out):
        assert r.handed_over and r.k == 3
        assert_handoff_identical(ref(reference_server, c), r, "TP 2 concurrent")


def test_negative_control_main_without_the_eager_kv_diverges(pdd, reference_server, prompts):
    """MD's rank 0 zeroes the eager tokens' KV after its EXTEND (half the heads): the comparison fails."""
    ids = prompts.ids(400, seed=1420)
    want = ref(reference_server, ids, 200)
    with pdd.knobs("main", drop_eager_kv=True):
        r = relayed(pdd, greedy_body(ids, 200), k=16)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_handoff_identical(want, r, "TP 2 control")


def test_an_abort_of_a_held_request_ends_it_on_both_ranks(pdd, reference_server, prompts):
    out = abort_while_held(pdd, greedy_body(prompts.ids(80, seed=1430), 1500))
    assert out["decoded"] and out["held"] >= 1 and out["ended"], out
    ids = prompts.ids(60, seed=1431)
    assert_handoff_identical(ref(reference_server, ids, 16), relayed(pdd, greedy_body(ids, 16), k=2), "after the abort")


def test_pools_return_to_idle_on_both_decode_roles(pdd):
    assert decode_roles_idle(pdd) == []
