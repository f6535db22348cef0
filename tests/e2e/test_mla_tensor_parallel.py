"""TP 2 on every role on the MLA model (DeepSeek-V3 architecture; CPU, gloo, each server's two ranks bound
to cores 0 and 1; RLD and MD on sglang's overlap scheduler). An MLA pool is not sharded by head: every rank
holds the whole latent row, so P's fan-out sends each rank's pool to the same rank of RLD and MD, and on
RLD and MD rank 1 replays rank 0's decisions (sglang_pdd.decode.rank_sync). Tokens equal the single MLA
server's (TP 1), one-shot and catch-up, with a negative control that fails."""

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.pdd_client import relayed_generate
from sglang_pdd.lab.testing.servers import http_json

from . import mla_cluster
from .cluster import decode_roles_idle

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18780
PAGE = 16
NEW = 32


@pytest.fixture(scope="module")
def pdd(server_group, mla_model):
    pdd = mla_cluster.start_mla_pdd(server_group, mla_model, base_port=32300, bootstrap_port=8984,
                                    token_port=TOKEN_PORT, handoff_timeout=30, page_size=PAGE, tp=2,
                                    decode_overlap=True)
    for s in (pdd.prefill, pdd.relay, pdd.main):
        info = http_json(s.url + "/get_server_info")[1]
        assert info["tp_size"] == 2, info.get("tp_size")
    for s, role in ((pdd.relay, "relay"), (pdd.main, "main")):  # rank 1 runs the follower
        assert f"sglang-pdd {role}: TP rank 1 replays rank 0's decisions" in s.log_text(), role
    return pdd


def relayed(pdd, body, k, **main_extra):
    with pdd.knobs("relay", relay_min_eager=k):
        r = relayed_generate(pdd.roles, body, main_first=not main_extra, main_extra=main_extra or None)
    assert r.handed_over and r.k >= k, r.relay["meta_info"]
    return r


def assert_identical(want, r, what):
    identity.check(want, r.relay["output_ids"], f"{what}: RLD's eager tokens (k={r.k})", prefix=True)
    identity.check(want, r.main["output_ids"], f"{what}: MD after the handoff at k={r.k}")


def test_one_shot_and_catch_up_handoffs_are_a_single_mla_servers(pdd, mla_reference, mla_prompts):
    ids = mla_prompts.ids(300, seed=1501)
    r = relayed(pdd, greedy_body(ids, NEW), k=5)
    assert r.k == 5
    assert_identical(identity.reference(mla_reference.url, ids, NEW), r, "MLA TP 2 one-shot")
    ids = mla_prompts.ids(220, seed=1502)
    r = relayed(pdd, greedy_body(ids, 64), k=12, handoff="catch-up", chunk=4)
    assert_identical(identity.reference(mla_reference.url, ids, 64), r, "MLA TP 2 catch-up")


def test_negative_control_main_without_the_eager_latent_rows_diverges(pdd, mla_reference, mla_prompts):
    """MD's rank 0 zeroes the eager tokens' latent rows after its EXTEND: the comparison fails."""
    ids = mla_prompts.ids(260, seed=1503)
    want = identity.reference(mla_reference.url, ids, 96)
    with pdd.knobs("main", drop_eager_kv=True):
        r = relayed(pdd, greedy_body(ids, 96), k=16)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_identical(want, r, "MLA TP 2 control")


def test_pools_return_to_idle_on_both_decode_roles(pdd):
    assert decode_roles_idle(pdd) == []
