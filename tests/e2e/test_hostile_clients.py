"""Hostile clients against a live cluster (the PDD router in front of P, RLD and MD on real sglang).

Every probe that once killed, froze or exhausted a server (issue 31's findings) is sent to every endpoint
it applies to: each gets its clear 4xx/503 in bounded time, and afterwards every server is up, every pool
is back to idle and a normal request through the router is token-identical to a single server, with its
handoff. docs/faults.md ("Hostile clients") lists each probe with the test that covers it.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.lab.testing.slow_grammars import nested
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import by_state, decode_roles_idle, metric
from .shared_cluster import KEYED, ROLE_KEY, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(KEYED)]

BASE = 31500
EAGER = 4
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 3
GRAMMAR_TIMEOUT_S = 0.5  # the slow grammars below (slow_grammars.nested(400)) compile for 27 s
ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def cluster(request, shared_clusters, server_group, tiny_model):
    pdd = cluster_for(request, shared_clusters, tiny_model)
    pdd.set_knobs("relay", relay_min_eager=EAGER)
    router = server_group.start("pdd-router-hostile", PddRouterConfig(
        prefill=[(pdd.prefill.url, pdd.bootstrap_port)], relay=[(pdd.relay.url, pdd.token_port)], main=[pdd.main.url],
        tokenizer=tiny_model, port=BASE + 3, pipeline="relay",
        extra=["--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S),
               "--migration-limit", "1", "--grammar-compile-timeout-s", str(GRAMMAR_TIMEOUT_S)],
        role_api_key=ROLE_KEY)).wait_ready()
    return pdd, router


def post_raw(url: str, data: bytes, timeout: float = 60.0) -> tuple[int, dict | str]:
    """POST bytes as they are (NaN, lone surrogates, deep nesting: what json.dumps would not send)."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def body_for(endpoint: str, ids: list[int], n: int, **keys) -> dict:
    """A request to `endpoint` with `keys` where that endpoint takes them (sglang's sampling_params or
    the OpenAI body's top level)."""
    if endpoint == "/generate":
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, **keys}}
    if endpoint == "/v1/completions":
        return {"model": "m", "prompt": ids, "max_tokens": n, "temperature": 0, **keys}
    return {"model": "m", "messages": [{"role": "user", "content": "say something"}], "max_tokens": n,
            "temperature": 0, **keys}


def raw_body(endpoint: str, keys_json: str) -> bytes:
    """The body of `body_for` with `keys_json` (raw JSON members) spliced in where sampling keys go."""
    base = json.dumps(body_for(endpoint, [5, 6, 7], 4))
    marker = '"temperature": 0'
    return base.replace(marker, marker + ", " + keys_json, 1).encode()


# (name, raw JSON members, endpoints, words the error must contain)
PROBES = [
    ("top_k over int32 (killed P)", '"top_k": 2147483648', ENDPOINTS, "top_k"),
    ("temperature NaN", '"temperature": NaN', ENDPOINTS, "NaN"),
    ("top_p Infinity", '"top_p": Infinity', ENDPOINTS, "Infinity"),
    ("logit_bias Infinity", '"logit_bias": {"5": Infinity}', ("/generate",), "Infinity"),
    ("logit_bias huge", '"logit_bias": {"5": 1e300}', ("/generate",), "logit_bias"),
    ("stream_interval a string", '"stream_interval": "x"', ("/generate",), "stream_interval"),
    ("stream_interval huge", '"stream_interval": 1000000', ("/generate",), "stream_interval"),
    ("stop_regex (froze decode)", '"stop_regex": "(.|.)*Q"', ("/generate",), "stop_regex"),
    ("17 stop strings", '"stop": ' + json.dumps([f"s{i}" for i in range(17)]), ENDPOINTS, "stop"),
    ("a 10k-char stop string", '"stop": ["' + "ab" * 5000 + '"]', ENDPOINTS, "stop"),
    ("a lone surrogate in stop", '"stop": ["\\ud800"]', ENDPOINTS, "stop"),
    ("stop_token_ids out of vocab", '"stop_token_ids": [1000000000]', ENDPOINTS, "stop_token_ids"),
    ("stream_options not an object", '"stream": true, "stream_options": 5',
     ("/v1/completions", "/v1/chat/completions"), "stream_options"),
    ("logprobs (dropped silently: /v1/completions)", '"logprobs": 2', ("/v1/completions",), "logprobs"),
    ("tools on the builtin layer", '"tools": [{"type": "function"}]', ("/v1/completions",), "tools"),
    ("lora_path (dropped silently)", '"lora_path": "x"', ENDPOINTS, "lora_path"),
    # round 3 (issue 47): sizes bounded by what they cost, grammars by their compile
    ("301 logit_bias keys", '"logit_bias": ' + json.dumps({str(i): 1 for i in range(301)}), ("/generate",),
     "logit_bias"),
    ("logit_bias keys that alias (07 is 7)", '"logit_bias": {"07": 1}', ("/generate",), "logit_bias"),
    ("top_logprobs 21", '"logprobs": true, "top_logprobs": 21', ("/v1/chat/completions",), "top_logprobs"),
    ("a json_schema that compiles for seconds", '"json_schema": ' + json.dumps(json.dumps(nested(400))),
     ("/generate",), "json_schema"),
    ("a response_format that compiles for seconds", '"response_format": ' + json.dumps(
        {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(400)}}),
     ("/v1/chat/completions",), "response_format"),
    # (a tools list that compiles for seconds renders a prompt longer than the tiny model's 32768 tokens, refused
    # on its length first: tests/unit/router/api/grammar/test_guard.py sends one through sglang's chat layer)
    ("129 tools", '"tools": ' + json.dumps([{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
     ("/v1/chat/completions",), "tools"),
]
CASES = [(name, members, ep, words) for name, members, eps, words in PROBES for ep in eps]


@pytest.mark.parametrize("name, members, endpoint, words", CASES, ids=[f"{c[0]} {c[2]}" for c in CASES])
def test_a_hostile_value_is_a_400_naming_it(cluster, name, members, endpoint, words):
    pdd, router = cluster
    status, out = post_raw(router.url + endpoint, raw_body(endpoint, members))
    assert status == 400, (name, status, out)
    assert words in json.dumps(out, ensure_ascii=False), (name, out)
    assert router.alive() and pdd.prefill.alive() and pdd.relay.alive() and pdd.main.alive()


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_deeply_nested_or_non_object_body_is_a_400(cluster, endpoint):
    _, router = cluster
    for data in (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, b"[1, 2, 3]", b'"text"', b"{not json"):
        status, out = post_raw(router.url + endpoint, data)
        assert status == 400, (data[:40], status, out)


def test_model_name_is_bounded(cluster):
    _, router = cluster
    status, out = http_json(router.url + "/v1/completions", body_for("/v1/completions", [5, 6, 7], 2, model="m" * 1_000_000))
    assert status == 400 and "model" in json.dumps(out), (status, str(out)[:300])


def open_slowloris(url: str, n: int) -> list[socket.socket]:
    """`n` connections to the router: half announce a 60 MB body and send one byte of it, half never
    finish their headers."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for i in range(n):
        s = socket.create_connection((host, int(port)), timeout=30)
        if i % 2:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 60000000\r\n\r\n{")
        else:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket, deadline: float) -> bool:
    """True once the server closed `s` (EOF or reset, after any error response it sent)."""
    s.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            if not s.recv(65536):
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_a_slowloris_burst_does_not_stop_a_normal_client(cluster, reference_server, prompts):
    """300 connections that never finish their request: a normal client is served beside them (token-
    identical, handed over), and the router closes every one of them after its read timeout."""
    pdd, router = cluster
    socks = open_slowloris(router.url, 300)
    try:
        ids = prompts.ids(300, seed=3101)
        want = identity.reference(reference_server.url, ids, 32)
        status, out = http_json(router.url + "/generate", greedy_body(ids, 32))
        assert status == 200, out
        identity.check(want, out["output_ids"], "beside a slowloris burst")
        assert ReplyMeta.of(out["meta_info"]).handoff_tokens is not None
        deadline = time.monotonic() + 60 * (HEADER_TIMEOUT_S + BODY_TIMEOUT_S)  # a safety net, not a speed check
        still_open = [i for i, s in enumerate(socks) if not closed_by_server(s, deadline)]
        assert not still_open, f"{len(still_open)} slow connections never closed by the router"
    finally:
        for s in socks:
            s.close()
    refused = metric(router.url, "sglang_pdd_router_refused_total")
    assert sum(v for k, v in refused.items() if "timeout" in dict(k).get("reason", "")) >= 300, refused


def test_a_non_streamed_client_that_disconnects_aborts_every_roles_copy(cluster, prompts):
    """The client sends a long non-streamed request and goes away: the router aborts P's, RLD's and MD's
    copies (the roles' generated tokens stop far short of max_new_tokens) and every pool is idle."""
    pdd, router = cluster
    n, n_prompt = 8000, 200
    gen_before = sum(_generated(u) for u in (pdd.relay.url, pdd.main.url))
    host, port = router.url.removeprefix("http://").split(":")
    body = json.dumps(body_for("/generate", prompts.ids(n_prompt, seed=3102), n, ignore_eos=True)).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    _wait(lambda: any(_kv_in_use(u) > n_prompt + 16 for u in (pdd.relay.url, pdd.main.url)))  # decoding
    s.close()
    assert not decode_roles_idle(pdd, timeout_s=120)
    gen = sum(_generated(u) for u in (pdd.relay.url, pdd.main.url)) - gen_before
    assert gen < n // 2, f"the roles generated {gen} of {n} tokens after the client left"


def test_a_request_beside_huge_list_form_bodies_is_served(cluster, reference_server, prompts):
    """Issue 47: four 20 MB chat bodies whose text sits in list-form content parts are each a 400 naming the
    context length, refused on their characters before any tokenizer runs; a normal request sent beside
    them is served and exact within its client's 60 s timeout (before the text pre-check saw content parts,
    one beside four 25 MB bodies waited 124 s)."""
    pdd, router = cluster
    part = {"type": "text", "text": "lorem ipsum " * 4096}
    big = json.dumps({"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [part] * 400}]}).encode()
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(post_raw(router.url + "/v1/chat/completions", big)))
               for _ in range(4)]
    for t in threads:
        t.start()
    ids = prompts.ids(300, seed=4703)
    want = identity.reference(reference_server.url, ids, 24)
    status, out = http_json(router.url + "/generate", greedy_body(ids, 24), timeout=60)
    for t in threads:
        t.join()
    assert status == 200, out
    identity.check(want, out["output_ids"], "beside four 20 MB bodies")
    assert [s for s, _ in answers] == [400] * 4, answers
    assert all("context length" in a["error"]["message"] for _, a in answers), answers


def test_many_clients_leaving_at_random_moments_leave_nothing_behind(cluster, prompts):
    """Issue 47: 36 clients on the three endpoints, streamed and not, each leaving at its own random moment
    (seeded: before its body ends, while P prefills, mid-decode, around the handoff). The router aborts
    every role's copy of each: the roles stop far short of what was asked, every decode pool and row comes
    back, and the router holds nothing (no request in flight, on any peer, no body bytes, no tokenizer
    job). Before asyncio.timeout replaced wait_for (bpo-42130 on Python 3.11), a cancellation that
    arrived as the drain's read completed was lost and that client's request ran to its end."""
    pdd, router = cluster
    n, clients = 2000, 36
    rng = random.Random(4701)
    gen_before = sum(_generated(u) for u in (pdd.relay.url, pdd.main.url))
    host, port = router.url.removeprefix("http://").split(":")
    moments = [(rng.uniform(0, 2.5), rng.random() < 0.1) for _ in range(clients)]  # a tenth leave mid-body

    def leave(i: int) -> None:
        endpoint = ENDPOINTS[i % 3]
        body = body_for(endpoint, prompts.ids(150 + 7 * i, seed=4702 + i), n, ignore_eos=True)
        body = json.dumps({**body, "stream": bool(i // 3 % 2)}).encode()
        head = (f"POST {endpoint} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        wait, cut = moments[i]
        with socket.create_connection((host, int(port))) as s:
            s.sendall(head + (body[:len(body) // 2] if cut else body))
            time.sleep(wait)

    threads = [threading.Thread(target=leave, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not decode_roles_idle(pdd, timeout_s=120)
    gauges = ("sglang_pdd_router_in_flight", "sglang_pdd_router_peer_in_flight", "sglang_pdd_router_body_bytes",
              "sglang_pdd_router_tokenizer_queue")
    _wait(lambda: not any(v for g in gauges for v in metric(router.url, g).values()))
    gen = sum(_generated(u) for u in (pdd.relay.url, pdd.main.url)) - gen_before
    assert gen < clients * n // 4, f"the roles generated {gen} of {clients * n} tokens after the clients left"


def _generated(url: str) -> float:
    """Output tokens of the requests the server ended (sglang counts them at the end, aborts included)."""
    return sum(metric(url, "sglang:generation_tokens_total").values())


def _kv_in_use(url: str) -> float:
    kv = by_state(url, "sglang_pdd_kv_pool_tokens")
    return kv["total"] - kv["available"] - kv["evictable"] if kv else 0


def _wait(cond, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.1)


def test_afterwards_every_server_is_up_idle_and_exact(cluster, reference_server, prompts):
    """Runs last in this module: after every probe above, nothing leaked and the cluster is exact."""
    pdd, router = cluster
    for s in (router, pdd.prefill, pdd.relay, pdd.main):
        assert s.alive(), s.log_tail()
        status, _ = http_json(s.url + "/health", timeout=30)
        assert status == 200
    assert not decode_roles_idle(pdd)
    for endpoint in ENDPOINTS[:1]:
        ids = prompts.ids(400, seed=3103)
        want = identity.reference(reference_server.url, ids, 48)
        status, out = http_json(router.url + endpoint, greedy_body(ids, 48))
        assert status == 200, out
        identity.check(want, out["output_ids"], "after the hostile clients")
        assert ReplyMeta.of(out["meta_info"]).handoff_tokens is not None
