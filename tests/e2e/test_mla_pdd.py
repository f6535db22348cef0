"""PDD on an MLA model (the DeepSeek-V3-architecture test model, `TinyModelSpec(arch="mla")`): P, RLD and
MD run sglang's own MLA KV pool (`MLATokenToKVPool`, one latent row per token and layer) and its own
page-by-page Mooncake transfer; the router's answers equal a single MLA server's, greedy and seeded.

* relay pipeline (P fans out: RLD gets all the latent KV, MD only its miss), handoff forced at k >= 4 by
  RLD's `relay_min_eager` knob and counted on MD;
* MD's EXTEND over t1..tk (one-shot at exactly k, and catch-up) is sglang's own MLA extend: the handoff
  attention kernel refuses any pool but `MHATokenToKVPool` and falls through to it;
* P->MD direct;
* MD's decode radix cache on latent pages: a second turn sends MD only what it misses;
* negative control: MD discarding the eager tokens' latent rows (`drop_eager_kv`) diverges;
* the decode roles' pools and rows are idle afterwards;
* migration: RLD SIGKILLed before the handoff, the router's request goes on P->MD (MD held the latent
  KV of the fan-out) and ends with a single server's tokens; MD is idle after.

RLD and MD run sglang's non-overlap loop, as the reference does. MLA servers are slow on CPU: short prompts
and outputs."""

import os
import signal

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, sse_chunks, stream_generate
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.pdd_client import relayed_generate
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from . import mla_cluster
from .cluster import decode_roles_idle, kv_bytes_per_token, metric
from .router_checks import EAGER, assert_one_handoff, check_generate, handoffs_on_main, main_leg_bytes

pytestmark = pytest.mark.e2e

BASE = 32000
TOKEN_PORT = 18750
PAGE = 16
CHUNK = 256  # P's chunked prefill: a longer prompt's later chunks are MLA's absorbed path over cached rows
N = 32
SEEDED = {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 4321}


@pytest.fixture(scope="module")
def mla(server_group, mla_model, mla_reference):
    pdd = mla_cluster.start_mla_pdd(server_group, mla_model, base_port=BASE, bootstrap_port=8987,
                                    token_port=TOKEN_PORT, handoff_timeout=30, page_size=PAGE, prefill_chunk=CHUNK)
    pdd.set_knobs("relay", relay_min_eager=EAGER)

    def router(name, port, pipeline):
        return server_group.start(name, PddRouterConfig(
            prefill=[(pdd.prefill.url, pdd.bootstrap_port)], relay=[(pdd.relay.url, TOKEN_PORT)],
            main=[pdd.main.url], tokenizer=mla_model, port=port, pipeline=pipeline, openai_frontend="builtin"))

    routers = {"relay": router("mla-router", BASE + 3, "relay"), "direct": router("mla-router-direct", BASE + 4,
                                                                                   "direct")}
    for r in routers.values():
        r.wait_ready()
    return {**routers, "main": pdd.main, "prefill": pdd.prefill, "pdd": pdd, "reference": mla_reference}


@pytest.mark.parametrize("pipeline", ["relay", "direct"])
def test_greedy_through_the_router_is_a_single_mla_servers(mla, mla_prompts, pipeline):
    check_generate(mla, mla["reference"], mla_prompts.ids(300, seed=340), pipeline, stream=False, n=N)


@pytest.mark.parametrize("pipeline", ["relay", "direct"])
def test_seeded_through_the_router_is_a_single_mla_servers(mla, mla_prompts, pipeline):
    check_generate(mla, mla["reference"], mla_prompts.ids(280, seed=341), pipeline, stream=True, n=N,
                   what="seeded", **SEEDED)


def attention_batches(pdd, path: str, reason: str | None = None) -> float:
    return sum(v for k, v in metric(pdd.main.url, "sglang_pdd_handoff_attention_batches_total").items()
               if dict(k)["path"] == path and (reason is None or dict(k)["reason"] == reason))


def relayed(pdd, ids, n, k=None, min_k=2, **kw):
    """One request P -> RLD -> MD; with `k`, MD's legs first and RLD answers MD's Ready at exactly k."""
    with pdd.knobs("relay", relay_min_eager=k if k is not None else min_k):
        r = relayed_generate(pdd.roles, greedy_body(ids, n), main_first=k is not None, **kw)
    assert r.handed_over and r.k >= (k or min_k), (r.k, r.relay["meta_info"])
    return r


def test_mds_handoff_extend_is_sglangs_mla_extend_one_shot_and_catch_up(mla, mla_prompts):
    """MD's EXTEND over t1..tk runs sglang's own MLA extend: even with the handoff kernel's CPU path
    allowed (MD's `handoff_kernel_cpu` knob) the hook refuses the MLA pool (reason "pool") and the
    tokens equal the reference's. One-shot at exactly k = 6 (250 + 6 = 256: the 6th eager token ends
    MD's 16th page), and catch-up in chunks of 4 while RLD goes on."""
    pdd = mla["pdd"]
    ids = mla_prompts.ids(250, seed=342)
    want = identity.reference(mla["reference"].url, ids, N)
    with pdd.knobs("main", handoff_kernel_cpu=True):
        before = attention_batches(pdd, "sglang", "pool")
        r = relayed(pdd, ids, N, k=6, main_extra={"handoff": "one-shot"})
        assert r.k == 6 and attention_batches(pdd, "sglang", "pool") == before + 1
        identity.check(want, r.relay["output_ids"], "RLD's eager tokens (k=6)", prefix=True)
        assert len(r.relay["output_ids"]) == 6
        identity.check(want, r.main["output_ids"], "MD after the one-shot handoff at k=6")
        ids = mla_prompts.ids(200, seed=346)
        want = identity.reference(mla["reference"].url, ids, 64)
        r = relayed(pdd, ids, 64, min_k=12, main_extra={"handoff": "catch-up", "chunk": 4})
        identity.check(want, r.relay["output_ids"], f"RLD's eager tokens (k={r.k})", prefix=True)
        identity.check(want, r.main["output_ids"], f"MD after the catch-up handoff at k={r.k}")
        assert attention_batches(pdd, "sglang", "pool") >= before + 3, "catch-up: its chunks and the final step"
    assert attention_batches(pdd, "kernel") + attention_batches(pdd, "mixed") == 0


def test_md_gets_only_its_miss_from_its_radix_cache(mla, mla_prompts, mla_model, figures):
    """Turn 2 (turn 1's prompt and output, then more) through the relay pipeline: MD reuses the latent
    pages it cached, P's fan-out sends it at most the rest (whole pages); RLD gets all of it."""
    kvb = kv_bytes_per_token(mla_model)
    first = mla_prompts.ids(300, seed=343)
    out1 = http_json(mla["relay"].url + "/generate", greedy_body(first, N))[1]
    second = first + out1["output_ids"] + mla_prompts.ids(100, seed=344)
    before = main_leg_bytes(mla)
    check_generate(mla, mla["reference"], second, "relay", stream=False, n=N, what="turn 2")
    moved = main_leg_bytes(mla) - before
    cached = (len(first) + N - 1) // PAGE * PAGE  # turn 1's prompt and output but its last token's KV
    assert 0 < moved <= (len(second) - cached + PAGE) * kvb, (moved, len(second), cached, kvb)
    assert moved * 3 < len(second) * kvb
    figures.append(f"MLA turn 2 of {len(second)} tokens ({kvb} B of latent KV per token): P sent MD "
                   f"{moved / 1024:.0f} KiB (its miss), the whole prompt is {len(second) * kvb / 1024:.0f} KiB")


def test_negative_control_md_without_the_eager_latent_rows_diverges(mla, mla_prompts):
    """The control the identity above stands on: MD zeroing the latent rows its EXTEND wrote for
    t1..t(k-1) (`drop_eager_kv`) gives other tokens after the handoff, though RLD's are right."""
    pdd, ids = mla["pdd"], mla_prompts.ids(300, seed=345)
    want = identity.reference(mla["reference"].url, ids, 96)
    with pdd.knobs("main", drop_eager_kv=True), pdd.knobs("relay", relay_min_eager=24):
        before = handoffs_on_main(mla)
        out = stream_generate(mla["relay"].url, greedy_body(ids, 96))
        assert_one_handoff(mla, before, min_k=24)
    assert ReplyMeta.of(out["meta_info"]).pipeline == "P->RLD->MD"
    identity.check(want, out["output_ids"][:24], "the eager tokens", prefix=True)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(want, out["output_ids"], "MLA control")


def test_the_decode_roles_are_idle_afterwards(mla):
    assert decode_roles_idle(mla["pdd"]) == []


def test_last_rld_killed_before_the_handoff_migrates_to_md_token_identically(mla, mla_prompts):
    """Last in the module (it kills RLD): no handoff (RLD's `relay_min_eager` out of reach), SIGKILL on
    RLD once 8 tokens are out; the stream goes on P->MD without a gap in its tokens, and equals the
    single server's. Without the router's migration this request fails (tests/e2e/test_md_pool.py)."""
    pdd, ids, n = mla["pdd"], mla_prompts.ids(260, seed=347), 48
    want = identity.reference(mla["reference"].url, ids, n)
    pdd.set_knobs("relay", relay_min_eager=10 ** 6)
    seen, last = [], None
    for chunk in sse_chunks(mla["relay"].url, greedy_body(ids, n)):
        assert "error" not in chunk, chunk
        assert chunk["output_ids"][:len(seen)] == seen, "the client's stream went back"
        seen, last = chunk["output_ids"], chunk
        if len(seen) >= 8 and pdd.relay.proc.poll() is None:
            os.killpg(pdd.relay.proc.pid, signal.SIGKILL)
    meta = ReplyMeta.of(last["meta_info"])
    assert meta.migrations == 1 and meta.handoff_tokens is None and meta.migration_pipelines == ["P->MD"], meta
    identity.check(want, seen, "migrated after RLD's SIGKILL (MLA)")
    assert decode_roles_idle(pdd, roles=("main",)) == []
