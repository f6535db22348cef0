"""TP 2 on every role on the MLA model (DeepSeek-V3 architecture; CPU, gloo, each server's two ranks bound
to cores 0 and 1; RLD and MD on sglang's overlap scheduler). An MLA pool is not sharded by head: every rank
holds the whole latent row, so P's fan-out sends each rank's pool to the same rank of RLD and MD, and on
RLD and MD rank 1 replays rank 0's decisions (sglang_pdd.decode.rank_sync).

The reference is the session's single MLA server at TP 1: a relayed request on the TP 2 roles (gloo's
all-reduce of the two ranks' partial sums) gives its tokens, one-shot and catch-up, with a negative control
that fails (near ties certified as everywhere). That proves TP 2's arithmetic and the pipeline at once; a
single TP 2 server beside the roles (another two ranks to start, on a 2-core CI box) was the reference
before, and gave the TP 1 server's tokens on these prompts too."""

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body

from . import mla_cluster
from .cluster import assert_handoff_identical, assert_tp, decode_roles_idle, relayed_at

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18780
PAGE = 16
NEW = 32


@pytest.fixture(scope="module")
def pdd(server_group, mla_model):
    pdd = mla_cluster.start_mla_pdd(server_group, mla_model, base_port=32300, bootstrap_port=8984,
                                    token_port=TOKEN_PORT, handoff_timeout=30, page_size=PAGE, tp=2,
                                    decode_overlap=True)
    assert_tp(pdd, 2)
    return pdd


def test_one_shot_and_catch_up_handoffs_are_a_single_mla_servers(pdd, mla_reference, mla_prompts):
    ids = mla_prompts.ids(300, seed=1501)
    r = relayed_at(pdd, greedy_body(ids, NEW), k=5)
    assert r.k == 5
    assert_handoff_identical(identity.reference(mla_reference.url, ids, NEW), r, "MLA TP 2 one-shot")
    ids = mla_prompts.ids(220, seed=1502)
    r = relayed_at(pdd, greedy_body(ids, 64), 12, main_first=False, main_extra={"handoff": "catch-up", "chunk": 4})
    assert_handoff_identical(identity.reference(mla_reference.url, ids, 64), r, "MLA TP 2 catch-up")


def test_negative_control_main_without_the_eager_latent_rows_diverges(pdd, mla_reference, mla_prompts):
    """MD's rank 0 zeroes the eager tokens' latent rows after its EXTEND: the comparison fails."""
    ids = mla_prompts.ids(260, seed=1503)
    want = identity.reference(mla_reference.url, ids, 96)
    with pdd.knobs("main", drop_eager_kv=True):
        r = relayed_at(pdd, greedy_body(ids, 96), k=16)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_handoff_identical(want, r, "MLA TP 2 control")


def test_pools_return_to_idle_on_both_decode_roles(pdd):
    assert decode_roles_idle(pdd) == []
