"""The core of PDD on real sglang: RLD streams t1..tk, hands over by token IDs, MD runs ONE EXTEND
over them and continues; RLD's t1..tk followed by MD's tokens equal a single server's output, greedy
and seeded. Pages of 16 tokens and P's chunked prefill (256) are crossed on purpose. RLD and MD run
sglang's overlap scheduler here (docs/overlap.md); the other e2e modules run its non-overlap loop.

k is set, not waited for: MD's legs go first (`main_first`) and RLD's test knob `relay_min_eager`
makes it answer MD's Ready at exactly k tokens; every test that names a handoff asserts its k."""

import time

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.pdd_client import held_on_main, relayed_generate, relayed_generate_many
from sglang_pdd.lab.testing.servers import http_json

from .cluster import abort_while_held, decode_roles_idle, metric
from .relay_checks import NEW, assert_identical, ref, relayed
from .shared_cluster import OVERLAP, OVERLAP_PAGE as PAGE, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(OVERLAP)]

SEEDED = {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 1234}


@pytest.fixture(scope="module")
def pdd(request, shared_clusters, tiny_model):
    """shared_cluster.OVERLAP: RLD and MD on sglang's overlap scheduler, and a single server on that loop
    (test_relay_restarts takes the same cluster next, and replaces its RLD and MD processes)."""
    return cluster_for(request, shared_clusters, tiny_model)


@pytest.fixture(scope="module")
def reference_server(pdd):
    """This module's reference: a single server on the decode roles' loop. sglang 0.5.23's overlap loop
    counts a penalized request's outputs one step late, so with penalties its logprobs differ from the
    non-overlap loop's (docs/overlap.md); without penalties the two loops give the same outputs."""
    return pdd.reference


def handoff_batches(pdd) -> dict[int, float]:
    return {int(dict(k)["size"]): v for k, v in metric(pdd.main.url, "sglang_pdd_handoff_extend_batches_total").items()}


def relay_counter(pdd, name: str, **labels) -> float:
    return sum(v for k, v in metric(pdd.relay.url, name).items()
               if all(dict(k).get(a) == b for a, b in {"role": "relay", **labels}.items()))


# -- where the handoff lands: k = 1, on a page boundary, one past it, max_new_tokens - 1 --------------

@pytest.mark.parametrize("k, n", [(1, NEW), (6, NEW), (7, NEW), (19, 20)],
                         ids=["k1", "page-boundary", "one-past", "max-new-minus-1"])
def test_handoff_at_exactly_k_is_token_identical(pdd, reference_server, prompts, k, n):
    """250 + 6 = 256: the 6th eager token ends MD's 16th page; k = 19 of 20 leaves MD one token."""
    ids = prompts.ids(250, seed=31)
    assert_identical(ref(reference_server, ids, n), relayed(pdd, greedy_body(ids, n), k=k), f"k={k}")


@pytest.mark.parametrize("n_prompt", [256, 257, 1000, 3000])
def test_prompts_on_page_and_chunk_boundaries(pdd, reference_server, prompts, n_prompt):
    """256: exactly 16 pages and one prefill chunk; 257: one token past both; 1000 and 3000: P prefills in
    4 and 12 chunks of 256 while it fans out."""
    ids = prompts.ids(n_prompt, seed=n_prompt)
    assert_identical(ref(reference_server, ids, 48), relayed(pdd, greedy_body(ids, 48), k=9), f"{n_prompt} tokens")


def test_handoff_with_every_leg_at_once(pdd, reference_server, prompts):
    ids = prompts.ids(700, seed=700)
    assert_identical(ref(reference_server, ids, 96), relayed(pdd, greedy_body(ids, 96), min_k=4), "at once")


def test_penalties_count_the_eager_tokens(pdd, reference_server, prompts):
    ids = prompts.ids(150, seed=35)
    sp = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    assert_identical(ref(reference_server, ids, 200, **sp), relayed(pdd, greedy_body(ids, 200, **sp), k=12),
                     "penalties")


def test_logprobs_cover_the_eager_tokens(pdd, reference_server, prompts):
    ids = prompts.ids(150, seed=36)
    body = {**greedy_body(ids, 160), "return_logprob": True}
    want = ref(reference_server, ids, 160)
    r = relayed(pdd, body, k=10)
    assert_identical(want, r, "logprobs")
    got = [t[0] for t in r.main["meta_info"]["output_token_logprobs"]]  # (logprob, token id, text) per token
    assert len(got) == len(want.logprobs) == 160
    assert max(abs(a - b) for a, b in zip(got, want.logprobs)) < 1e-3


def test_seeded_sampling_is_identical_across_the_handoff(pdd, reference_server, prompts):
    """temperature 0.8, top_p 0.9, a seed: P samples t1, RLD t2..tk, MD the rest in and after its EXTEND,
    and the tokens are a single server's with the same seed; another seed gives other tokens."""
    ids = prompts.ids(400, seed=37)
    want = ref(reference_server, ids, 96, **SEEDED)
    assert_identical(want, relayed(pdd, greedy_body(ids, 96, **SEEDED), k=8), "seeded one-shot")
    r = relayed(pdd, greedy_body(ids, 96, **SEEDED), k=14, main_extra={"handoff": "catch-up", "chunk": 4})
    assert_identical(want, r, "seeded catch-up")
    other = ref(reference_server, ids, 96, **{**SEEDED, "sampling_seed": 4321})
    with pytest.raises(AssertionError, match="diverges"):
        identity.check(want, other.tokens, "another seed")


def test_concurrent_handoffs_share_one_extend_step(pdd, reference_server, prompts):
    cases = [prompts.ids(200 + 50 * i, seed=40 + i) for i in range(4)]
    before = handoff_batches(pdd)
    # MD starts the EXTEND once all four are ready: one batch of 4, whatever the timing
    with pdd.knobs("relay", relay_min_eager=3), pdd.knobs("main", main_gather_handoffs=len(cases)):
        out = relayed_generate_many(pdd.roles, [greedy_body(c, NEW) for c in cases], main_first=True)
    for c, r in zip(cases, out):
        assert r.handed_over and r.k == 3
        assert_identical(ref(reference_server, c), r, "concurrent")
    after = handoff_batches(pdd)
    assert after.get(len(cases), 0) == before.get(len(cases), 0) + 1, (before, after)


def test_part_of_the_prompt_already_cached_on_main(pdd, reference_server, prompts):
    first = prompts.ids(900, seed=60)
    r1 = relayed(pdd, greedy_body(first, 24), k=4)
    assert_identical(ref(reference_server, first, 24), r1, "turn 1")
    second = first + r1.tokens + prompts.ids(80, seed=61)  # the next turn of the conversation
    r2 = relayed(pdd, greedy_body(second, 120), k=8)
    assert_identical(ref(reference_server, second, 120), r2, "turn 2")
    assert r2.main["meta_info"]["cached_tokens"] >= len(first) // PAGE * PAGE


# -- negative controls: the comparisons above fail when MD skips the eager tokens' KV ---------------

@pytest.mark.parametrize("mode", ["one-shot", "catch-up"])
def test_negative_control_main_without_the_eager_kv_diverges(pdd, reference_server, prompts, mode):
    ids = prompts.ids(400, seed=70 if mode == "one-shot" else 71)  # prompts nothing else uses
    want = ref(reference_server, ids, 200)
    with pdd.knobs("main", drop_eager_kv=True):
        r = relayed(pdd, greedy_body(ids, 200), k=16, main_extra={"handoff": mode, "chunk": 4})
    identity.check(want, r.relay["output_ids"], "RLD's eager tokens", prefix=True)
    identity.check(want, r.main["output_ids"][: r.k], "MD's copy of the eager tokens", prefix=True)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        assert_identical(want, r, f"{mode} control")


# -- failures end one request, never a server --------------------------------------------------------

def test_bad_relay_params_fail_the_request_not_the_server(pdd, reference_server, prompts):
    body = greedy_body(prompts.ids(30, seed=80), 4)
    body["sampling_params"]["custom_params"] = {"pdd": {"v": 99, "relay_room": 1, "relay": "tcp://127.0.0.1:1"}}
    status, out = http_json(pdd.main.url + "/generate", {**body, "bootstrap_host": "127.0.0.1",
                                                         "bootstrap_port": pdd.bootstrap_port, "bootstrap_room": 5})
    assert status >= 400 and "unsupported protocol version 99" in str(out)
    ids = prompts.ids(50, seed=81)
    assert_identical(ref(reference_server, ids, 16), relayed(pdd, greedy_body(ids, 16), k=2), "after a bad body")


def test_relay_finishing_first_tells_main_which_lets_go(pdd, reference_server, prompts):
    """MD is ready first but RLD's knob asks for more eager tokens than the request has: RLD finishes it
    (length) and tells MD, which lets go and keeps the KV for the next turn."""
    ids = prompts.ids(120, seed=50)
    with pdd.knobs("relay", relay_min_eager=9):
        r = relayed_generate(pdd.roles, greedy_body(ids, 8), main_first=True)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "length"
    identity.check(ref(reference_server, ids, 8), r.tokens, "finished on the relay")
    assert "error" in r.main or r.main["meta_info"]["finish_reason"]["type"] == "abort", r.main
    # MD let its KV land anyway (--pdd-relay-finished-kv keep): the next turn hits MD's cache
    second = ids + r.tokens + prompts.ids(30, seed=51)
    r2 = relayed(pdd, greedy_body(second, 120), k=5)
    assert_identical(ref(reference_server, second, 120), r2, "next turn")
    assert r2.main["meta_info"]["cached_tokens"] >= len(ids) // PAGE * PAGE


def test_aborting_a_held_request_ends_both_copies_and_main_keeps_serving(pdd, reference_server, prompts):
    """MD holds its copy (KV landed, waiting for tokens) while RLD decodes, with no handoff in sight; an
    abort on both ends both copies, MD lets go of what it holds, and the next relayed request is
    token-identical (the pools are checked last)."""
    ids = prompts.ids(80, seed=95)
    out = abort_while_held(pdd, greedy_body(ids, 1500))
    assert out["decoded"] and out["held"] >= 1 and out["ended"], out
    relay = out["r"].relay if "r" in out else None
    assert relay is None or relay["meta_info"]["finish_reason"]["type"] == "abort", relay["meta_info"]
    assert relay is None or len(relay["output_ids"]) < 1500
    deadline = time.monotonic() + 60
    while held_on_main(pdd.main.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held_on_main(pdd.main.url) == 0
    ids = prompts.ids(50, seed=96)
    assert_identical(ref(reference_server, ids, 16), relayed(pdd, greedy_body(ids, 16), k=3), "after the abort")


# -- catch-up: RLD hands over in chunks while it keeps decoding ---------------------------------------

@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_catch_up_handoff_is_token_identical(pdd, reference_server, prompts, chunk):
    ids = prompts.ids(300, seed=100 + chunk)
    chunks_before = relay_counter(pdd, "sglang_pdd_catchup_chunks_total")
    r = relayed(pdd, greedy_body(ids, 400), k=None, min_k=chunk + 8,
                main_extra={"handoff": "catch-up", "chunk": chunk})
    assert_identical(ref(reference_server, ids, 400), r, f"catch-up chunk {chunk}")
    assert relay_counter(pdd, "sglang_pdd_catchup_chunks_total") > chunks_before, f"k={r.k}: no non-final chunk"


def test_concurrent_catch_up_handoffs(pdd, reference_server, prompts):
    cases = [prompts.ids(250 + 40 * i, seed=110 + i) for i in range(3)]
    with pdd.knobs("relay", relay_min_eager=12):
        out = relayed_generate_many(pdd.roles, [greedy_body(c, 300) for c in cases],
                                    main_extra={"handoff": "catch-up", "chunk": 4})
    for c, r in zip(cases, out):
        assert r.handed_over and r.k >= 12
        assert_identical(ref(reference_server, c, 300), r, "concurrent catch-up")


def test_catch_up_keeps_penalties_and_logprobs_exact(pdd, reference_server, prompts):
    """Penalties: the tokens (the penalized logprobs are exact on the non-overlap loop, test_pdd_router;
    on the overlap loop sglang counts penalties one step late, differently per path: docs/overlap.md).
    Logprobs: exact, through the catch-up chunks and the final step."""
    ids = prompts.ids(200, seed=120)
    sp = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    r = relayed(pdd, greedy_body(ids, 300, **sp), k=None, min_k=12, main_extra={"handoff": "catch-up", "chunk": 3})
    assert_identical(ref(reference_server, ids, 300, **sp), r, "catch-up with penalties")
    want = ref(reference_server, ids, 300)
    r = relayed(pdd, {**greedy_body(ids, 300), "return_logprob": True}, k=None, min_k=12,
                main_extra={"handoff": "catch-up", "chunk": 3})
    assert_identical(want, r, "catch-up with logprobs")
    got = [t[0] for t in r.main["meta_info"]["output_token_logprobs"]]
    diffs = [abs(a - b) for a, b in zip(got, want.logprobs)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    assert len(got) == 300 and diffs[worst] < 1e-3, f"k={r.k}: logprob of token {worst} off by {diffs[worst]:.3g}"


def test_adaptive_mode_is_chosen_on_the_relay_and_counted(pdd, reference_server, prompts):
    def modes():
        return {(dict(k)["mode"], dict(k)["reason"]): v
                for k, v in metric(pdd.relay.url, "sglang_pdd_handoff_mode_total").items()}

    before = modes()
    ids = prompts.ids(120, seed=130)
    r = relayed(pdd, greedy_body(ids, 200), k=6, main_extra={"handoff": "adaptive", "chunk": 2})
    assert_identical(ref(reference_server, ids, 200), r, "adaptive")
    after = modes()
    grew = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    # MD runs this request alone: a one-shot EXTEND stalls nobody
    assert grew == {("one-shot", "md_small_batch"): 1}, grew
    inputs = {dict(k)["input"]: v for k, v in metric(pdd.relay.url, "sglang_pdd_handoff_policy_input").items()}
    assert set(inputs) == {"rld_running", "rld_kv_usage", "md_batch"} and inputs["rld_running"] >= 1


def attention_batches(pdd, path: str, reason: str | None = None) -> float:
    return sum(v for k, v in metric(pdd.main.url, "sglang_pdd_handoff_attention_batches_total").items()
               if dict(k)["path"] == path and (reason is None or dict(k)["reason"] == reason))


def test_handoff_attention_hook_leaves_cpu_to_sglang_and_its_kernel_path_is_token_identical(
        pdd, reference_server, prompts):
    """On CPU the attention hook hands MD's handoff EXTEND to sglang's backend (counted with reason "cpu").
    With MD's test knob the same hook runs its kernel path inside the server (the kernel's torch
    reference on CPU: the store of the new K/V, req_to_token, prefix and extend lengths, the output
    layout, pages of 16), for one-shot and catch-up handoffs, and the tokens still equal a single server's."""
    cpu_before = attention_batches(pdd, "sglang", "cpu")
    ids = prompts.ids(260, seed=140)
    assert_identical(ref(reference_server, ids, 48), relayed(pdd, greedy_body(ids, 48), k=3), "sglang path")
    assert attention_batches(pdd, "sglang", "cpu") > cpu_before
    kernel_before = attention_batches(pdd, "kernel")
    with pdd.knobs("main", handoff_kernel_cpu=True):
        ids = prompts.ids(500, seed=141)
        r = relayed(pdd, greedy_body(ids, 240), k=21, main_extra={"handoff": "one-shot"})
        assert_identical(ref(reference_server, ids, 240), r, "kernel path, one-shot")
        one_shot = attention_batches(pdd, "kernel")
        assert one_shot >= kernel_before + 1
        ids = prompts.ids(300, seed=145)
        r = relayed(pdd, greedy_body(ids, 300), k=None, min_k=12, main_extra={"handoff": "catch-up", "chunk": 4})
        assert_identical(ref(reference_server, ids, 300), r, "kernel path, catch-up")
        assert attention_batches(pdd, "kernel") >= one_shot + 2, f"k={r.k}: chunks and the final step"
    assert attention_batches(pdd, "sglang", "arguments") + attention_batches(pdd, "mixed") == 0


def test_pools_return_to_idle_on_relay_and_main(pdd):
    assert decode_roles_idle(pdd) == []
