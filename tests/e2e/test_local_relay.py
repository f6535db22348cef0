"""A prefill that relays (issue 45, `--pdd-relay local`): P decodes the relayed request in its own batches and
hands it to MD by token IDs, no RelayDecode. Token-identical to the single server, greedy and seeded, with
the handoff asserted at k >= the relay's `relay_min_eager` knob, concurrent requests, and P and MD idle
afterwards. Controls: another seed differs; MD's part without P's eager tokens (the stream stitched one
token short) differs. The servers are test_kv_events' P and MD (shared_cluster.PAIR: P relays locally)."""

import threading

import pytest

from sglang_pdd.lab.testing.client import generate, greedy_body, greedy_ids
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.pdd_client import local_relayed_generate
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta
from sglang_pdd.transfer.pool_state import KEY as POOL_KEY
from sglang_pdd.transfer.pool_state import idle_problems

from .cluster import idle_rows, metric, wait_until
from .shared_cluster import PAIR, PAIR_BOOT as BOOT, PAIR_P_RELAY, PAIR_PORT, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(PAIR)]

MIN_EAGER = 6
SEEDED = {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 1234}


@pytest.fixture(scope="module")
def pd(request, shared_clusters, tiny_model):
    pd = cluster_for(request, shared_clusters, tiny_model)
    pd.set_prefill_knobs(relay_min_eager=MIN_EAGER)
    yield pd
    pd.clear_knobs()


def relayed(pd, body):
    return local_relayed_generate(pd.prefill.url, pd.decode.url, "127.0.0.1", BOOT, PAIR_P_RELAY, body)


def plain_pd(pd, to_p: dict, to_md: dict) -> tuple[dict, dict]:
    """P's and MD's replies to one PD request sent to both at once (each body with its bootstrap fields)."""
    out: dict = {}

    def call(name, url, body):
        try:
            out[name] = generate(url, body)
        except Exception as e:
            out[name] = e

    t = threading.Thread(target=call, args=("p", pd.prefill.url, to_p))
    t.start()
    call("md", pd.decode.url, to_md)
    t.join()
    for name in ("p", "md"):
        if isinstance(out[name], Exception):
            raise out[name]
    return out["p"], out["md"]


def p_handoffs(pd) -> float:
    return sum(v for k, v in metric(pd.prefill.url, "sglang_pdd_handoffs_total").items() if dict(k).get("role") == "prefill")


def local_relay_events(pd) -> dict:
    return {dict(k)["event"]: v for k, v in metric(pd.prefill.url, "sglang_pdd_local_relay_requests_total").items()}


def test_relayed_on_p_greedy_is_identical_with_a_handoff(pd, reference_server, prompts):
    ids = prompts.ids(300, seed=451)
    want = greedy_ids(reference_server.url, ids, 40)
    before = p_handoffs(pd)
    r = relayed(pd, greedy_body(ids, 40))
    assert r.handed_over, r.relay["meta_info"]["finish_reason"]
    assert r.k >= MIN_EAGER, r.k
    assert r.tokens == want
    assert r.relay["output_ids"][:r.k] == want[:r.k]  # P's stream carries exactly its k eager tokens
    assert r.tokens[:r.k - 1] + r.main["output_ids"][r.k:] != want  # control: one eager token short
    assert wait_until(lambda: p_handoffs(pd) >= before + 1, "P counts its handoff")
    assert local_relay_events(pd).get("decoding", 0) >= 1  # P decoded it (not parked)


def test_relayed_on_p_seeded_is_identical_and_another_seed_differs(pd, reference_server, prompts):
    ids = prompts.ids(200, seed=452)
    want = greedy_ids(reference_server.url, ids, 48, **SEEDED)
    other = greedy_ids(reference_server.url, ids, 48, **{**SEEDED, "sampling_seed": 4321})
    r = relayed(pd, greedy_body(ids, 48, **SEEDED))
    assert r.handed_over and r.k >= MIN_EAGER, (r.k, r.relay["meta_info"]["finish_reason"])
    assert r.tokens == want
    assert other != want  # control: the seed decides these tokens


def test_penalties_on_p_count_its_tokens(pd, reference_server, prompts):
    ids = prompts.ids(150, seed=459)
    sp = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    want = greedy_ids(reference_server.url, ids, 200, **sp)
    r = relayed(pd, greedy_body(ids, 200, **sp))
    assert r.handed_over and r.k >= MIN_EAGER, r.k
    assert r.tokens == want
    assert want != greedy_ids(reference_server.url, ids, 200)  # control: the penalties change these tokens


def test_concurrent_relays_on_p_are_identical(pd, reference_server, prompts):
    prompts_ids = [prompts.ids(120 + 40 * i, seed=460 + i) for i in range(3)]
    wants = [greedy_ids(reference_server.url, ids, 32) for ids in prompts_ids]
    results: dict = {}

    def one(i):
        results[i] = relayed(pd, greedy_body(prompts_ids[i], 32))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert results[i].handed_over and results[i].k >= MIN_EAGER, i
        assert results[i].tokens == wants[i], i


def test_a_p_short_of_kv_parks_the_request_and_hands_md_its_first_token(pd, reference_server, prompts):
    pd.set_prefill_knobs(relay_min_eager=MIN_EAGER, local_relay_park=True)
    try:
        parked = local_relay_events(pd).get("parked", 0)
        ids = prompts.ids(180, seed=456)
        r = relayed(pd, greedy_body(ids, 24))
        assert r.handed_over and r.k == 1, r.k  # P decoded nothing: MD took over from P's first token
        assert r.tokens == greedy_ids(reference_server.url, ids, 24)
        assert local_relay_events(pd)["parked"] == parked + 1
    finally:
        pd.set_prefill_knobs(relay_min_eager=MIN_EAGER)


def test_plain_pd_through_the_relaying_p_is_untouched(pd, reference_server, prompts):
    ids = prompts.ids(150, seed=470)
    body = {**greedy_body(ids, 16), "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT, "bootstrap_room": 470}
    p_out, d_out = plain_pd(pd, body, body)
    assert d_out["output_ids"] == greedy_ids(reference_server.url, ids, 16)
    assert len(p_out["output_ids"]) <= 1  # P did not decode it


def test_relayed_on_p_streamed_with_logprobs_is_identical(pd, reference_server, prompts):
    ids = prompts.ids(250, seed=453)
    body = {**greedy_body(ids, 32), "return_logprob": True}
    want = generate(reference_server.url, body)
    r = local_relayed_generate(pd.prefill.url, pd.decode.url, "127.0.0.1", BOOT, PAIR_P_RELAY, body, stream=True)
    assert r.handed_over and r.k >= MIN_EAGER, r.k
    assert r.tokens == want["output_ids"]
    # P's logprobs of its k tokens are the single server's (its own decode steps, not recomputed)
    mine = [lp[0] for lp in r.relay["meta_info"]["output_token_logprobs"][:r.k]]
    ref = [lp[0] for lp in want["meta_info"]["output_token_logprobs"][:r.k]]
    assert mine == pytest.approx(ref, abs=1e-4)


def test_relayed_on_p_under_a_json_schema_is_identical(pd, reference_server, prompts):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}
    import json as _json

    ids = prompts.ids(120, seed=454)
    body = greedy_body(ids, 40, json_schema=_json.dumps(schema))
    body["sampling_params"].pop("ignore_eos")
    want = generate(reference_server.url, body)["output_ids"]
    r = relayed(pd, body)
    assert r.handed_over, r.relay["meta_info"]["finish_reason"]  # the grammar rode P's steps and the handoff
    assert r.tokens == want


def test_a_client_leaving_mid_relay_ends_every_copy_and_leaves_p_idle(pd, prompts):
    pd.set_prefill_knobs(relay_min_eager=100000)  # P never answers MD's Ready: it relays until the client leaves
    aborted = local_relay_events(pd).get("aborted", 0)
    try:
        ids = prompts.ids(200, seed=455)
        out: dict = {}
        chunks = []

        def client():
            try:
                out["r"] = local_relayed_generate(pd.prefill.url, pd.decode.url, "127.0.0.1", BOOT, PAIR_P_RELAY,
                                                  greedy_body(ids, 2000), stream=True, stop_after=8, seen=chunks)
            except Exception as e:  # the client left: MD's copy ends with an error, P's stream was cut
                out["e"] = e

        t = threading.Thread(target=client)
        t.start()
        t.join(timeout=300)
        assert not t.is_alive()
        assert len(chunks) >= 8  # it left while P was relaying
        assert wait_until(lambda: local_relay_events(pd).get("aborted", 0) == aborted + 1, "P aborted its copy")
    finally:
        pd.set_prefill_knobs(relay_min_eager=MIN_EAGER)
    test_p_and_md_are_idle_afterwards(pd)


def test_the_router_relays_on_the_prefill_that_relays(pd, server_group, reference_server, prompts, tiny_model):
    """`--prefill URL BOOTSTRAP_PORT TOKEN_PORT`: no --relay, and each relayed request is relayed on P."""
    router = server_group.start("router-local-relay", PddRouterConfig(
        prefill=[(pd.prefill.url, BOOT, int(PAIR_P_RELAY.rpartition(":")[2]))], relay=[], main=[pd.decode.url],
        tokenizer=tiny_model, port=PAIR_PORT + 3, pipeline="relay", openai_frontend="builtin")).wait_ready()
    for seed in (457, 458):
        ids = prompts.ids(260, seed=seed)
        out = generate(router.url, greedy_body(ids, 40))
        meta = ReplyMeta.of(out["meta_info"])
        assert meta.pipeline == "P->RLD->MD" and meta.handoff_tokens is not None and meta.handoff_tokens >= MIN_EAGER
        assert out["output_ids"] == greedy_ids(reference_server.url, ids, 40)
    relayed = {dict(k)["target"]: v for k, v in metric(router.url, "sglang_pdd_router_relayed_total").items()}
    assert relayed == {"prefill": 2}


def test_a_relay_here_the_router_did_not_sign_is_served_p_to_md(pd, reference_server, prompts):
    """A client asking P to relay for it (no signature): P serves the request as plain PD and counts it."""
    from sglang_pdd.protocol.request import RequestParams, with_params

    refused = local_relay_events(pd).get("refused_unsigned", 0)
    ids = prompts.ids(140, seed=471)
    body = {**greedy_body(ids, 16), "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT, "bootstrap_room": 471}
    p_out, d_out = plain_pd(pd, with_params(body, RequestParams(v=1, relay_here=True)), body)
    assert d_out["output_ids"] == greedy_ids(reference_server.url, ids, 16)
    assert len(p_out["output_ids"]) <= 1  # P did not decode it
    assert wait_until(lambda: local_relay_events(pd).get("refused_unsigned", 0) == refused + 1, "P counts it")


def test_p_and_md_are_idle_afterwards(pd):
    def p_idle():
        status, info = http_json(pd.prefill.url + "/get_server_info")
        state = info["internal_states"][0][POOL_KEY]
        return not idle_problems(state) and state["local_relay"]["relayed"] == 0

    wait_until(p_idle, "P holds nothing after its relays")
    assert wait_until(lambda: idle_rows(pd.decode.url) == pd.idle_rows, "MD's rows back to idle")
