"""The PDD router end to end on real sglang: one stream across the handoff, token-identical to a
single server, through /generate and the OpenAI endpoints, streaming and not."""

import json
import urllib.request

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, stream_generate
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import by_state, metric
from .router_checks import (CONSTRAINTS, EAGER, N, assert_one_handoff, check_constrained, check_generate,
                            completion_text, constrained_body, constrained_reference, handoffs_on_main,
                            main_leg_bytes, openai, router_metric)
from .shared_cluster import KEYED, ROLE_KEY, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(KEYED)]

SEEDED = {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 77}


@pytest.fixture(scope="module")
def router(request, shared_clusters, server_group, tiny_model):
    # shared_cluster.KEYED: every role runs sglang's --api-key and the routers send it
    # (SGLANG_PDD_ROLE_API_KEY), as production should; RLD and MD stream deltas (--incremental-streaming-output)
    pdd = cluster_for(request, shared_clusters, tiny_model)
    pdd.set_knobs("relay", relay_min_eager=EAGER)
    p, rld, md, boot = pdd.prefill, pdd.relay, pdd.main, pdd.bootstrap_port
    base = 30800  # the routers': base + 3 ...

    def launch(name, port, pipeline, extra=(), key=ROLE_KEY, frontend="auto"):
        return server_group.start(name, PddRouterConfig(
            prefill=[(p.url, boot)], relay=[(rld.url, pdd.token_port)], main=[md.url], tokenizer=tiny_model,
            port=port, pipeline=pipeline, extra=list(extra), role_api_key=key, openai_frontend=frontend))

    def start(name, port, pipeline, extra=(), key=ROLE_KEY):  # the tests' own routers serve /generate alone
        return launch(name, port, pipeline, extra, key, frontend="builtin").wait_ready()

    # launched together, then waited for: their start-ups overlap
    relay_router = launch("pdd-router", base + 3, "relay")
    direct_router = launch("pdd-router-direct", base + 4, "direct")
    # auto, told a very slow WAN (so a cold prompt's transfer looks long) and a fast RLD: short outputs
    # of cold prompts are odd traffic
    auto_router = launch("pdd-router-auto", base + 5, "auto", ["--wan-mbit", "1", "--wan-rtt-ms", "1",
                         "--odd-output-threshold", "100", "--rld-tpot-ms", "10", "--bandwidth-poll-s", "0"])
    for r in (relay_router, direct_router, auto_router):
        r.wait_ready()
    return {"relay": relay_router, "direct": direct_router, "auto": auto_router, "main": md, "relay_server": rld,
            "prefill": p, "pdd": pdd, "idle_rows": pdd.idle_rows,
            "start_router": lambda name, port, extra, key=ROLE_KEY: start(name, port, "auto", extra, key)}


@pytest.mark.parametrize("pipeline", ["relay", "direct"])
@pytest.mark.parametrize("stream", [False, True])
def test_generate_is_token_identical_to_a_single_server(router, reference_server, prompts, pipeline, stream):
    check_generate(router, reference_server, prompts.ids(600, seed=100 + stream), pipeline, stream)


@pytest.mark.parametrize("pipeline", ["relay", "direct"])
def test_deltas_from_the_decode_roles_come_out_whole_with_their_logprobs(router, reference_server, prompts, pipeline):
    """RLD and MD stream deltas here (sglang's --incremental-streaming-output; O(n) bytes, not O(n^2)):
    the router's answer is the single server's, tokens and logprobs, across the handoff."""
    for role in ("relay_server", "main"):
        status, info = role_call(router[role].url, "/get_server_info", key=ROLE_KEY)
        assert status == 200 and info["incremental_streaming_output"] is True, role
    ids, n = prompts.ids(400, seed=107), 48
    want = identity.reference(reference_server.url, ids, n)
    before = handoffs_on_main(router)
    status, got = http_json(router[pipeline].url + "/generate", {**greedy_body(ids, n), "return_logprob": True})
    assert status == 200, got
    identity.check(want, got["output_ids"], f"router {pipeline}, incremental roles")
    if pipeline == "relay":
        assert_one_handoff(router, before)
    lps = got["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == got["output_ids"]  # one per token: none lost or repeated at the handoff
    assert max(abs(a[0] - b) for a, b in zip(lps, want.logprobs)) < 1e-3


def test_penalized_logprobs_are_exact_across_the_handoff(router, reference_server, prompts):
    """Frequency and presence penalties count RLD's eager tokens on MD: tokens and logprobs are a single
    server's, on sglang's non-overlap loop (the overlap loop counts penalties a step late: docs/overlap.md)."""
    ids, n, sp = prompts.ids(200, seed=108), 160, {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    want = identity.reference(reference_server.url, ids, n, **sp)
    before = handoffs_on_main(router)
    status, got = http_json(router["relay"].url + "/generate", {**greedy_body(ids, n, **sp), "return_logprob": True})
    assert status == 200, got
    identity.check(want, got["output_ids"], "router relay, penalties")
    assert_one_handoff(router, before)
    lps = [t[0] for t in got["meta_info"]["output_token_logprobs"]]
    assert len(lps) == n and max(abs(a - b) for a, b in zip(lps, want.logprobs)) < 1e-3


@pytest.mark.parametrize("pipeline", ["relay", "direct"])
def test_seeded_sampling_is_identical_to_a_single_server(router, reference_server, prompts, pipeline):
    """temperature 0.8, top_p 0.9 and a seed: the same tokens as a single server, across the handoff."""
    check_generate(router, reference_server, prompts.ids(500, seed=105), pipeline, stream=True, what="seeded",
                   **SEEDED)


def test_negative_control_the_router_path_catches_main_without_the_eager_kv(router, reference_server, prompts):
    pdd = router["pdd"]
    ids = prompts.ids(500, seed=106)
    want = identity.reference(reference_server.url, ids, 200)
    with pdd.knobs("main", drop_eager_kv=True), pdd.knobs("relay", relay_min_eager=24):
        before = handoffs_on_main(router)
        out = stream_generate(router["relay"].url, greedy_body(ids, 200))
        assert_one_handoff(router, before, min_k=24)
    identity.check(want, out["output_ids"][:24], "the eager tokens", prefix=True)
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(want, out["output_ids"], "router control")


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_structured_output_is_a_single_servers_across_the_handoff(router, reference_server, prompts, kind):
    """sglang's grammar backend (xgrammar) on every role: P samples t1 under the grammar's mask, RLD
    t2..tk, MD accepts t1..tk into its grammar in the handoff EXTEND and masks t(k+1) on. Greedy and
    seeded, relayed (a handoff at k >= 4, before the grammar completes) and direct: the single server's
    tokens, valid, ended by the grammar."""
    ids = prompts.ids(300, seed=180 + sorted(CONSTRAINTS).index(kind))
    for sp in ({}, SEEDED):
        want = constrained_reference(reference_server, ids, kind, **sp)
        for pipeline in ("relay", "direct"):
            check_constrained(router, want, ids, pipeline, kind, **sp)


def test_negative_control_main_skipping_the_grammar_advance_is_caught(router, reference_server, prompts):
    """The structured-output comparison bites: MD's grammar rolled back over the eager tokens
    (`main_skip_grammar_advance`) samples t(k+1) from the wrong state."""
    for i, kind in enumerate(sorted(CONSTRAINTS)):
        ids = prompts.ids(300, seed=180 + i)
        want = constrained_reference(reference_server, ids, kind)
        with router["pdd"].knobs("main", main_skip_grammar_advance=True):
            before = handoffs_on_main(router)
            status, out = http_json(router["relay"].url + "/generate", constrained_body(ids, kind))
            assert status == 200, out
            assert_one_handoff(router, before)
        with pytest.raises(AssertionError, match="single server"):
            identity.check(want, out["output_ids"], f"router control {kind}")


def test_odd_traffic_finishes_on_the_relay_and_its_wan_bytes_are_never_sent(router, reference_server, prompts):
    auto = router["auto"].url
    ids = prompts.ids(700, seed=140)  # cold on MD: ~11 MiB of KV over "1 Mbit/s"
    want = identity.reference(reference_server.url, ids, 16)
    avoided, wan = router_metric(auto, "sglang_pdd_router_wan_bytes_avoided_total"), main_leg_bytes(router)
    status, out = http_json(auto + "/generate", greedy_body(ids, 16))
    assert status == 200
    identity.check(want, out["output_ids"], "odd traffic on the relay")
    pdd = ReplyMeta.of(out["meta_info"])
    assert pdd.pipeline == "P->RLD" and pdd.reason.startswith("odd traffic"), pdd
    assert pdd.missed_bytes >= 700 * 16384 * 0.9
    assert router_metric(auto, "sglang_pdd_router_wan_bytes_avoided_total") - avoided == pdd.missed_bytes
    assert main_leg_bytes(router) == wan  # P sent MainDecode nothing
    # the same prompt with a long output is not odd: RLD relays, MD takes over
    before = handoffs_on_main(router)
    status, out = http_json(auto + "/generate", greedy_body(ids, 120))
    assert status == 200, out
    pdd = ReplyMeta.of(out["meta_info"])
    assert pdd.pipeline == "P->RLD->MD", pdd
    assert_one_handoff(router, before)
    assert main_leg_bytes(router) > wan
    # a request may name its pipeline; a bad name is a 400
    status, out = http_json(auto + "/generate", {**greedy_body(ids, 16), "pdd_pipeline": "direct"})
    assert status == 200 and ReplyMeta.of(out["meta_info"]).pipeline == "P->MD"
    identity.check(want, out["output_ids"], "named pipeline")
    status, out = http_json(auto + "/generate", {**greedy_body(ids, 16), "pdd_pipeline": "sideways"})
    assert status == 400 and "pdd_pipeline" in str(out)


def test_bandwidth_estimate_follows_completed_transfers(router, reference_server, prompts):
    auto = router["start_router"]("pdd-router-feed", 30806, ["--wan-mbit", "1", "--bandwidth-poll-s", "0.5"]).url
    before = router_metric(auto, "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second")
    assert abs(before - 1e6 / 8) < 1 or before > 1e6 / 8  # started from --wan-mbit 1
    for i in range(2):  # relayed fresh prompts: P's fan-out sends MD megabytes each (over loopback here)
        http_json(router["relay"].url + "/generate", greedy_body(prompts.ids(800, seed=150 + i), 4))
    import time

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        after = router_metric(auto, "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second")
        if after > 2 * before:
            break
        time.sleep(0.5)
    assert after > 2 * before, (before, after)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_text_matches_a_single_server(router, reference_server, prompts, stream):
    prompt = prompts.text(prompts.ids(400, seed=110))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 80, "temperature": 0, "ignore_eos": True}
    expected = openai(reference_server.url, "/v1/completions", body, stream=False)
    before = handoffs_on_main(router)
    got = openai(router["relay"].url, "/v1/completions", body, stream=stream)
    assert_one_handoff(router, before)
    if not stream:
        assert got["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"] == 80
    assert completion_text(got, stream) == (expected["choices"][0]["text"], "length")


def test_completions_with_a_seed_match_a_single_server(router, reference_server, prompts):
    body = {"model": "tiny", "prompt": prompts.ids(300, seed=111), "max_tokens": 64, "temperature": 0.8,
            "top_p": 0.9, "seed": 5, "ignore_eos": True}
    expected = openai(reference_server.url, "/v1/completions", body, stream=False)["choices"][0]["text"]
    before = handoffs_on_main(router)
    assert completion_text(openai(router["relay"].url, "/v1/completions", body, stream=True), True)[0] == expected
    assert_one_handoff(router, before)
    other = openai(reference_server.url, "/v1/completions", {**body, "seed": 6}, stream=False)
    assert other["choices"][0]["text"] != expected  # the seed decides the tokens


def test_negative_control_the_openai_path_catches_main_without_the_eager_kv(router, reference_server, prompts):
    pdd = router["pdd"]
    body = {"model": "tiny", "prompt": prompts.ids(450, seed=112), "max_tokens": 160, "temperature": 0,
            "ignore_eos": True}
    expected = openai(reference_server.url, "/v1/completions", body, stream=False)["choices"][0]["text"]
    with pdd.knobs("main", drop_eager_kv=True), pdd.knobs("relay", relay_min_eager=24):
        before = handoffs_on_main(router)
        text, _ = completion_text(openai(router["relay"].url, "/v1/completions", body, stream=True), True)
        assert_one_handoff(router, before, min_k=24)
    assert text != expected


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_match_a_single_server(router, reference_server, stream):
    body = {"model": "tiny", "temperature": 0, "max_tokens": 64, "ignore_eos": True, "messages": [
        {"role": "system", "content": "You are a terse tool-using agent."},
        {"role": "user", "content": "List the files, then summarise them " * 20}]}
    expected = openai(reference_server.url, "/v1/chat/completions", body, stream=False)
    before = handoffs_on_main(router)
    got = openai(router["relay"].url, "/v1/chat/completions", body, stream=stream)
    assert_one_handoff(router, before)
    want = expected["choices"][0]["message"]["content"]
    if stream:
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in got if c.get("choices"))
    else:
        text = got["choices"][0]["message"]["content"]
        assert got["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert text == want


def test_stop_string_after_the_handoff_is_honoured(router, reference_server, prompts):
    # the stop string sits about 300 tokens in: far past the handoff (k is about 5 here), so that a slow
    # machine's late MD still takes over before RLD could reach it (a stop at 60 tokens once ended on RLD
    # on CI's two cores, with no handoff)
    ids = prompts.ids(300, seed=120)
    full = http_json(reference_server.url + "/generate", greedy_body(ids, 400))[1]["text"]
    at = len(full) * 3 // 4
    stop = full[at: at + 6]
    assert full.find(stop) == at, "the stop string occurs earlier: pick another slice"
    body = {"model": "tiny", "prompt": ids, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    expected = openai(reference_server.url, "/v1/completions", body, stream=False)["choices"][0]
    before = handoffs_on_main(router)
    got = openai(router["relay"].url, "/v1/completions", body, stream=False)["choices"][0]
    assert_one_handoff(router, before)
    assert expected["finish_reason"] == "stop"
    assert (got["text"], got["finish_reason"]) == (expected["text"], expected["finish_reason"])


def test_client_disconnect_aborts_every_role_and_nothing_leaks(router, prompts):
    ids = prompts.ids(200, seed=130)
    req = urllib.request.Request(router["relay"].url + "/generate",
                                 data=json.dumps({**greedy_body(ids, 2000), "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.readline()  # the first chunk arrived: the request is running; now walk away
    import time

    servers = (router["relay_server"].url, router["main"].url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = sum(metric(router["main"].url, "sglang_pdd_handoff_held_requests").values())
        rows = {u: by_state(u, "sglang_pdd_req_rows")["free"] for u in servers}
        if held == 0 and rows == {u: router["idle_rows"][u] for u in servers}:
            break
        time.sleep(0.5)
    assert held == 0 and rows == {u: router["idle_rows"][u] for u in servers}


def test_bad_requests_get_clear_errors_and_the_router_keeps_serving(router, reference_server, prompts):
    url = router["relay"].url
    assert http_json(url + "/generate", {"input_ids": [], "sampling_params": {}})[0] == 400
    assert http_json(url + "/v1/completions", {"prompt": "x", "n": 2})[0] == 400
    assert http_json(url + "/v1/chat/completions", {"messages": "hi"})[0] == 400
    ok = prompts.ids(50, seed=141)
    # issue 14 item 6: client errors are 400 with a message, never a 502 from a role
    for path, body, match in [
        ("/generate", greedy_body([5, 10 ** 7], 4), "vocabulary"),
        ("/v1/completions", {"prompt": [5, 10 ** 7], "max_tokens": 4}, "vocabulary"),
        ("/generate", greedy_body(ok, -1), "max_new_tokens"),
        ("/generate", {**greedy_body(ok, 4), "sampling_params": "fast"}, "sampling_params"),
        ("/generate", greedy_body(ok, 4, temperature=-1), "temperature"),
        ("/generate", greedy_body(list(ok) * 700, 4), "context length"),  # 35000 tokens > 32768
        ("/v1/completions", {"prompt": ok, "max_tokens": 40000}, "context length"),
    ]:
        status, out = http_json(url + path, body)
        assert status == 400 and match in json.dumps(out), (path, status, out)
        assert "127.0.0.1" not in json.dumps(out)
    check_generate(router, reference_server, prompts.ids(50, seed=140), "relay", stream=False, n=16)


@pytest.mark.parametrize("pipeline", ["direct", "relay"])
def test_client_pdd_params_are_dropped_and_md_keeps_serving(router, reference_server, prompts, pipeline):
    """issue 14 item 1's probe: a client's relay "tcp://nohost" (and main_room, bootstrap keys) once
    reached MD on the P->MD path and killed its scheduler."""
    ids = prompts.ids(300, seed=160)
    ref = identity.reference(reference_server.url, ids, 24)
    body = greedy_body(ids, 24, custom_params={"pdd": {"v": 1, "relay": "tcp://nohost", "relay_room": 5,
                                                       "main_room": 7}})
    body.update(bootstrap_host="10.255.255.1", bootstrap_room=5, rid="client-rid")
    status, out = http_json(router[pipeline].url + "/generate", body, timeout=120)
    assert status == 200, out
    identity.check(ref, out["output_ids"], f"{pipeline} with client pdd params")
    assert router["main"].alive()
    ids2 = prompts.ids(60, seed=161)
    # N tokens, as the module's other handoff checks: with 8, RLD could finish before MD was ready
    check_generate(router, reference_server, ids2, pipeline, stream=False)


def test_main_fails_cleanly_when_the_relay_never_heard_of_the_request(router, reference_server, prompts):
    """RLD without the request: MD's copy ends with a clear error after its handoff timeout (10 s on this
    cluster; RLD's answer for an unknown room also comes after it), and MD keeps serving. (A relay MD does
    not trust is refused at once, before any timeout: test_main_robustness.)"""
    import random
    import threading

    from sglang_pdd.lab.testing.pdd_client import signer_from_env
    from sglang_pdd.protocol.request import RequestParams, with_params

    pdd = router["pdd"]
    room = random.getrandbits(63)
    body = with_params(greedy_body(prompts.ids(60, seed=90), 8), signer_from_env().sign(
        RequestParams(v=1, relay_room=room, relay=pdd.roles.token_channel), room))
    body.update(bootstrap_host="127.0.0.1", bootstrap_port=pdd.bootstrap_port, bootstrap_room=room,
                rid=f"no-handoff-{room}")
    t = threading.Thread(target=role_call, args=(pdd.prefill.url, "/generate", body, ROLE_KEY))
    t.start()
    status, reply = role_call(pdd.main.url, "/generate", body, key=ROLE_KEY)
    role_call(pdd.prefill.url, "/abort_request", {"rid": body["rid"]}, key=ROLE_KEY)  # P's copy: nobody to serve
    t.join()
    assert status >= 400, reply
    assert "relay" in str(reply), reply
    assert router["main"].alive()
    check_generate(router, reference_server, prompts.ids(50, seed=91), "relay", stream=False, what="after a failure")


# -- who may talk to a role: the router, with the key (docs/faults.md) ------------------------------

def role_call(url: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, object]:
    """(status, body) of a call to a role, with `Authorization: Bearer KEY` when a key is given."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@pytest.mark.parametrize("role", ["main", "relay_server", "prefill"])
def test_a_role_refuses_callers_without_the_key(router, prompts, role):
    """Every test of this module reaches the roles through routers holding the key; a caller without it
    (MD's port crosses the WAN) gets 401 from /generate and /abort_request, a wrong key too, and the
    key opens them (the control). /health and /metrics stay open for probes and scrapers."""
    url = router[role].url
    body = greedy_body(prompts.ids(40, seed=170), 4)
    for key in (None, "wrong-" + ROLE_KEY):
        for path, b in (("/generate", body), ("/abort_request", {"rid": "", "abort_all": True}),
                        ("/get_server_info", None)):
            status, out = role_call(url, path, b, key=key)
            assert status == 401, (role, path, key, status, out)
    assert role_call(url, "/abort_request", {"rid": "no-such-request"}, key=ROLE_KEY)[0] == 200
    assert role_call(url, "/get_server_info", key=ROLE_KEY)[0] == 200
    assert role_call(url, "/health")[0] == 200 and role_call(url, "/metrics")[0] == 200
    assert router[role].alive()


def test_a_router_without_the_key_is_refused_and_the_roles_keep_serving(router, reference_server, prompts):
    """The negative control of the key the routers send: a router started without it (or with another
    one) gets every request refused by the roles; its client gets a clear 502 naming the refusal, no
    role dies, and the keyed router serves the next relayed request token-identically."""
    ids = prompts.ids(120, seed=171)
    for name, port, key in (("pdd-router-nokey", 30807, None), ("pdd-router-wrongkey", 30808, "wrong-" + ROLE_KEY)):
        url = router["start_router"](name, port, ["--pipeline", "relay", "--migration-limit", "0"], key).url
        before = handoffs_on_main(router)
        status, out = http_json(url + "/generate", greedy_body(ids, 8))
        assert status == 502 and "refused the router's key" in json.dumps(out), (name, status, out)
        assert handoffs_on_main(router) == before
    for role in ("prefill", "relay_server", "main"):
        assert router[role].alive(), role
    check_generate(router, reference_server, ids, "relay", stream=False, n=N, what="after refused routers")
