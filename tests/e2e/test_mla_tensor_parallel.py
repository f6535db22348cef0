"""TP 2 on every role on the MLA model (DeepSeek-V3 architecture; CPU, gloo, each server's two ranks bound
to cores 0 and 1; RLD and MD on sglang's overlap scheduler). An MLA pool is not sharded by head: every rank
holds the whole latent row, so P's fan-out sends each rank's pool to the same rank of RLD and MD, and on
RLD and MD rank 1 replays rank 0's decisions (sglang_pdd.decode.rank_sync).

The reference is a single MLA server at TP 2: the same arithmetic as the roles (gloo's all-reduce of the
two ranks' partial sums), so a divergence is the pipeline's, not TP 2's rounding against TP 1's. One-shot
and catch-up handoffs are token-identical to it, with a negative control that fails; the TP 2 server's
tokens against the TP 1 server's are compared too (near ties certified as everywhere)."""

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.launch_args import ServerConfig

from . import mla_cluster
from .cluster import assert_handoff_identical, assert_tp, decode_roles_idle, relayed_at

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18780
PAGE = 16
NEW = 32
REFERENCE_PORT = 32309


@pytest.fixture(scope="module")
def pdd(server_group, mla_model):
    pdd = mla_cluster.start_mla_pdd(server_group, mla_model, base_port=32300, bootstrap_port=8984,
                                    token_port=TOKEN_PORT, handoff_timeout=30, page_size=PAGE, tp=2,
                                    decode_overlap=True)
    assert_tp(pdd, 2)
    return pdd


@pytest.fixture(scope="module")
def tp2_reference(server_group, mla_model, pdd):
    """A single MLA server at TP 2 (its ranks on cores 0 and 1, as the roles')."""
    return server_group.start(f"mla-reference-tp2-{REFERENCE_PORT}", ServerConfig(
        model=mla_model, port=REFERENCE_PORT, nccl_port=REFERENCE_PORT + 1000, chunked_prefill_size=mla_cluster.CHUNK,
        env={**mla_cluster.MLA_ENV, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
        extra=[*mla_cluster.MLA_FLAGS, "--pdd-seeded-sampling", "on", "--tp-size", "2"])).wait_ready()


def test_the_tp2_server_gives_the_tp1_servers_tokens(tp2_reference, mla_reference, mla_prompts):
    """With its negative control: the TP 1 server on the same prompt with one token changed early on
    gives other tokens, and the same comparison fails."""
    for n, seed in ((300, 1501), (220, 1502)):
        ids = mla_prompts.ids(n, seed=seed)
        tp2 = identity.reference(tp2_reference.url, ids, 64)
        identity.check(identity.reference(mla_reference.url, ids, 64), tp2.tokens, f"MLA TP 2 vs TP 1 ({n} tokens)")
    other = list(ids)
    other[3] = next(t for t in ids[4:] if t != ids[3])  # a token of the vocabulary, another one
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(identity.reference(mla_reference.url, other, 64), tp2.tokens, "MLA TP 2 vs TP 1 control")


def test_one_shot_and_catch_up_handoffs_are_a_single_mla_servers(pdd, tp2_reference, mla_prompts):
    ids = mla_prompts.ids(300, seed=1501)
    r = relayed_at(pdd, greedy_body(ids, NEW), k=5)
    assert r.k == 5
    assert_handoff_identical(identity.reference(tp2_reference.url, ids, NEW), r, "MLA TP 2 one-shot")
    ids = mla_prompts.ids(220, seed=1502)
    r = relayed_at(pdd, greedy_body(ids, 64), 12, main_first=False, main_extra={"handoff": "catch-up", "chunk": 4})
    assert_handoff_identical(identity.reference(tp2_reference.url, ids, 64), r, "MLA TP 2 catch-up")


def test_negative_control_main_without_the_eager_latent_rows_diverges(pdd, tp2_reference, mla_prompts):
    """MD's rank 0 zeroes the eager tokens' latent rows after its EXTEND: the comparison fails."""
    ids = mla_prompts.ids(260, seed=1503)
    want = identity.reference(tp2_reference.url, ids, 96)
    with pdd.knobs("main", drop_eager_kv=True):
        r = relayed_at(pdd, greedy_body(ids, 96), k=16)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_handoff_identical(want, r, "MLA TP 2 control")


def test_pools_return_to_idle_on_both_decode_roles(pdd):
    assert decode_roles_idle(pdd) == []
