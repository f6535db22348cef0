"""The core of PDD on real sglang: RLD streams t1..tk, hands over by token IDs, MD runs ONE EXTEND
over them and continues; RLD's t1..tk followed by MD's tokens equal a single server's greedy output."""

import json
import os
import threading
import time

import pytest

from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.testing.client import generate, greedy_body, greedy_ids
from sglang_pdd.testing.servers import http_json

from .cluster import metric, start_pdd
from sglang_pdd.testing.pdd_client import Roles, relayed_generate

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18500
NEW = 64
IDLE_ROWS: dict[str, float] = {}
KNOBS: dict[str, str] = {}  # MD's test-knobs file (config.TestKnobs), re-read at every handoff batch
HANDOFF_TIMEOUT = 10


@pytest.fixture(scope="module")
def pdd(server_group, tiny_model, log_dir):
    KNOBS["main"] = os.path.join(log_dir, "relay-handoff-main-knobs.json")
    servers = start_pdd(server_group, tiny_model, base_port=30700, bootstrap_port=8997, token_port=TOKEN_PORT,
                        handoff_timeout=HANDOFF_TIMEOUT, main_env={ENV_TEST_KNOBS: KNOBS["main"]})
    IDLE_ROWS.update(servers.idle_rows)
    p, rld, md, boot = servers.prefill, servers.relay, servers.main, servers.bootstrap_port
    return Roles(prefill=p.url, relay=rld.url, main=md.url, bootstrap_host="127.0.0.1",
                 bootstrap_port=boot, token_channel=f"tcp://127.0.0.1:{TOKEN_PORT}")


def check(pdd, reference_server, ids, n=NEW, **kw):
    expected = greedy_ids(reference_server.url, ids, n)
    r = relayed_generate(pdd, greedy_body(ids, n), **kw)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff", r.relay["meta_info"]
    assert r.relay["output_ids"] == expected[: r.k]
    assert r.main["output_ids"] == expected, f"k={r.k}"
    assert r.tokens == expected
    return r


ATTEMPTS = 5


def relayed_with_eager(pdd, body_for, min_k: int, delay: float = 0.8, **kw):
    """relayed_generate until RLD decoded at least `min_k` eager tokens before the handoff: MD is
    held back twice as long after too few, half as long after RLD finished the request itself (how
    many tokens RLD decodes in a given delay depends on the box's load). `body_for(attempt)`."""
    for attempt in range(ATTEMPTS):
        r = relayed_generate(pdd, body_for(attempt), main_delay_s=delay, **kw)
        r.attempt = attempt
        handed = r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff"
        if handed and r.k >= min_k:
            return r
        delay = delay * 2 if handed else delay / 2
    return r


def relay_counter(pdd, name: str, **labels) -> float:
    return sum(v for k, v in metric(pdd.relay, name).items()
               if all(dict(k).get(a) == b for a, b in {"role": "relay", **labels}.items()))


def test_handoff_at_k1_when_main_is_ready_before_relay_decodes(pdd, reference_server, prompts):
    r = check(pdd, reference_server, prompts.ids(300, seed=31), relay_delay_s=1.5)
    assert r.k == 1


@pytest.mark.parametrize("n_prompt, main_delay", [(40, 0.4), (700, 0.8), (1500, 1.6)])
def test_handoff_after_relay_decoded_eager_tokens(pdd, reference_server, prompts, n_prompt, main_delay):
    r = check(pdd, reference_server, prompts.ids(n_prompt, seed=n_prompt), n=160, main_delay_s=main_delay)
    assert 1 <= r.k < 160


def test_penalties_count_the_eager_tokens(pdd, reference_server, prompts):
    ids = prompts.ids(150, seed=35)
    sp = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    expected = greedy_ids(reference_server.url, ids, 200, **sp)
    r = relayed_with_eager(pdd, lambda _: greedy_body(ids, 200, **sp), 2, delay=0.6)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff" and r.k > 1
    assert r.main["output_ids"] == expected, f"k={r.k}"


def test_logprobs_cover_the_eager_tokens(pdd, reference_server, prompts):
    ids = prompts.ids(150, seed=36)
    body = {**greedy_body(ids, 160), "return_logprob": True}
    ref = generate(reference_server.url, body)["meta_info"]["output_token_logprobs"]
    r = relayed_generate(pdd, body, main_delay_s=0.6)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff", r.main
    got = r.main["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in got] == [t[1] for t in ref]  # (logprob, token id, text) per output token
    assert max(abs(a[0] - b[0]) for a, b in zip(got, ref)) < 1e-3, f"k={r.k}"


def concurrently(fn, n: int) -> list:
    """fn(0..n-1) on n threads at once; the results (None where fn raised: its thread reports it)."""
    out = [None] * n

    def one(i):
        out[i] = fn(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_handoffs_share_one_extend_step(pdd, reference_server, prompts):
    cases = [prompts.ids(200 + 50 * i, seed=40 + i) for i in range(4)]
    out = concurrently(lambda i: check(pdd, reference_server, cases[i], relay_delay_s=1.0), len(cases))
    assert all(r is not None for r in out)
    sizes = metric(pdd.main, "sglang_pdd_handoff_extend_batches_total")
    assert max(int(dict(labels)["size"]) for labels in sizes) >= 2, sizes


def test_part_of_the_prompt_already_cached_on_main(pdd, reference_server, prompts):
    first = prompts.ids(900, seed=60)
    r1 = check(pdd, reference_server, first, n=24, relay_delay_s=0.5)
    second = first + r1.tokens + prompts.ids(80, seed=61)  # the next turn of the conversation
    r2 = check(pdd, reference_server, second, n=120, main_delay_s=0.3)
    assert r2.main["meta_info"]["cached_tokens"] >= len(first)


def test_negative_control_main_without_the_extend_kv_diverges(pdd, reference_server, prompts):
    cases = [prompts.ids(400, seed=70 + i) for i in range(ATTEMPTS)]  # prompts nothing else uses
    r = relayed_with_eager(pdd, lambda i: greedy_body(cases[i], 300), 8,
                           main_extra={"test_drop_eager_kv": True, "handoff": "one-shot"})
    expected = greedy_ids(reference_server.url, cases[r.attempt], 300)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff"
    assert r.k >= 8, "too few eager tokens for the control to mean anything"
    assert r.relay["output_ids"] == expected[: r.k]
    assert r.main["output_ids"][: r.k] == expected[: r.k]
    assert r.main["output_ids"] != expected


def test_bad_relay_params_fail_the_request_not_the_server(pdd, reference_server, prompts):
    body = greedy_body(prompts.ids(30, seed=80), 4)
    body["sampling_params"]["custom_params"] = {"pdd": {"v": 99, "relay_room": 1, "relay": "tcp://127.0.0.1:1"}}
    status, out = http_json(pdd.main + "/generate", {**body, "bootstrap_host": "127.0.0.1",
                                                     "bootstrap_port": pdd.bootstrap_port, "bootstrap_room": 5})
    assert status >= 400 and "unsupported protocol version 99" in str(out)
    check(pdd, reference_server, prompts.ids(50, seed=81), n=16, relay_delay_s=0.3)


@pytest.mark.parametrize("relay", ["unreachable", "never_heard_of_it"])
def test_main_fails_cleanly_when_the_relay_cannot_hand_over(pdd, reference_server, prompts, relay):
    """RLD unreachable, or RLD without the request: MD's copy ends with a clear error after the
    configured timeout (RLD's answer for an unknown room also comes after it), and MD keeps serving."""
    import random

    from sglang_pdd.protocol.request import RequestParams

    room = random.getrandbits(63)
    address = "tcp://127.0.0.1:1" if relay == "unreachable" else pdd.token_channel
    body = greedy_body(prompts.ids(60, seed=90), 8)
    body["sampling_params"]["custom_params"] = RequestParams(v=1, relay_room=room, relay=address).to_custom_params()
    body.update(bootstrap_host=pdd.bootstrap_host, bootstrap_port=pdd.bootstrap_port, bootstrap_room=room)
    out = {}
    t = threading.Thread(target=lambda: out.update(p=http_json(pdd.prefill + "/generate", body)))
    t.start()
    status, reply = http_json(pdd.main + "/generate", body)
    t.join()
    assert status >= 400, reply
    assert "relay" in str(reply), reply
    check(pdd, reference_server, prompts.ids(50, seed=91), n=16, relay_delay_s=0.3)


def attention_batches(pdd, path: str, reason: str | None = None) -> float:
    return sum(v for k, v in metric(pdd.main, "sglang_pdd_handoff_attention_batches_total").items()
               if dict(k)["path"] == path and (reason is None or dict(k)["reason"] == reason))


def test_handoff_attention_hook_leaves_cpu_to_sglang_and_its_kernel_path_is_token_identical(
        pdd, reference_server, prompts):
    """On CPU the attention hook hands MD's handoff EXTEND to sglang's backend (counted with reason "cpu").
    With MD's test knob the same hook runs its kernel path inside the server (the kernel's torch
    reference on CPU: the store of the new K/V, req_to_token, prefix and extend lengths, the output
    layout), for one-shot and catch-up handoffs, and the tokens still equal a single server's."""
    cpu_before = attention_batches(pdd, "sglang", "cpu")
    check(pdd, reference_server, prompts.ids(260, seed=140), n=48, relay_delay_s=0.3)
    assert attention_batches(pdd, "sglang", "cpu") > cpu_before
    assert attention_batches(pdd, "kernel") == 0
    with open(KNOBS["main"], "w") as f:
        json.dump({"handoff_kernel_cpu": True}, f)
    try:
        ids = [prompts.ids(500 + 40 * i, seed=141 + i) for i in range(ATTEMPTS)]
        r = relayed_with_eager(pdd, lambda i: greedy_body(ids[i], 240), 4, main_extra={"handoff": "one-shot"})
        check_identity(reference_server, ids[r.attempt], 240, r)
        one_shot = attention_batches(pdd, "kernel")
        assert one_shot >= 1, (r.k, metric(pdd.main, "sglang_pdd_handoff_attention_batches_total"))
        ids = [prompts.ids(300, seed=145 + i) for i in range(ATTEMPTS)]
        r = relayed_with_eager(pdd, lambda i: greedy_body(ids[i], 300), 8, delay=0.6,
                               main_extra={"handoff": "catch-up", "chunk": 4})
        check_identity(reference_server, ids[r.attempt], 300, r)
        assert attention_batches(pdd, "kernel") >= one_shot + 2, f"k={r.k}: chunks and the final step"
    finally:
        os.remove(KNOBS["main"])
    assert attention_batches(pdd, "sglang", "arguments") + attention_batches(pdd, "mixed") == 0


def test_pools_return_to_idle_on_relay_and_main(pdd):
    for url in (pdd.relay, pdd.main):
        deadline = time.monotonic() + 60
        while True:
            pool = {dict(k)["state"]: v for k, v in metric(url, "sglang_pdd_kv_pool_tokens").items()}
            rows = {dict(k)["state"]: v for k, v in metric(url, "sglang_pdd_req_rows").items()}
            held = sum(metric(url, "sglang_pdd_handoff_held_requests").values())
            idle = (pool and pool["available"] + pool["evictable"] == pool["total"] and pool["protected"] == 0
                    and rows["free"] == IDLE_ROWS[url] and held == 0)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert idle, (url, pool, rows, held)




def test_relay_finishing_first_tells_main_which_lets_go(pdd, reference_server, prompts):
    ids = prompts.ids(120, seed=50)
    expected = greedy_ids(reference_server.url, ids, 8)
    r = relayed_generate(pdd, greedy_body(ids, 8), main_delay_s=1.5)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "length"
    assert r.tokens == expected
    assert "error" in r.main or r.main["meta_info"]["finish_reason"]["type"] == "abort"
    # MD let its KV land anyway (--pdd-relay-finished-kv keep): the next turn hits MD's cache
    second = ids + r.tokens + prompts.ids(30, seed=51)
    r2 = check(pdd, reference_server, second, n=120, main_delay_s=0.3)
    assert r2.main["meta_info"]["cached_tokens"] >= len(ids)


# -- catch-up: RLD hands over in chunks while it keeps decoding ---------------------------------

def check_identity(reference_server, ids, n, r):
    expected = greedy_ids(reference_server.url, ids, n)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff", r.relay["meta_info"]
    assert r.relay["output_ids"] == expected[: r.k]
    assert r.main["output_ids"] == expected, f"k={r.k}"
    assert r.tokens == expected


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_catch_up_handoff_is_token_identical(pdd, reference_server, prompts, chunk):
    cases = [prompts.ids(300, seed=100 + 10 * chunk + i) for i in range(ATTEMPTS)]
    chunks_before = relay_counter(pdd, "sglang_pdd_catchup_chunks_total")
    r = relayed_with_eager(pdd, lambda i: greedy_body(cases[i], 400), chunk + 3, delay=0.6,
                           main_extra={"handoff": "catch-up", "chunk": chunk})
    check_identity(reference_server, cases[r.attempt], 400, r)
    assert r.k > chunk + 2, "too few eager tokens for a catch-up"
    assert relay_counter(pdd, "sglang_pdd_catchup_chunks_total") > chunks_before, f"k={r.k}: no non-final chunk"


def test_concurrent_catch_up_handoffs(pdd, reference_server, prompts):
    cases = [prompts.ids(250 + 40 * i, seed=110 + i) for i in range(3)]
    out = concurrently(lambda i: check(pdd, reference_server, cases[i], n=400, main_delay_s=0.6 + 0.2 * i,
                                       main_extra={"handoff": "catch-up", "chunk": 4}), len(cases))
    assert all(r is not None for r in out)


def test_catch_up_keeps_penalties_and_logprobs_exact(pdd, reference_server, prompts):
    ids = prompts.ids(200, seed=120)
    sp = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    body = {**greedy_body(ids, 300, **sp), "return_logprob": True}
    ref = generate(reference_server.url, body)["meta_info"]["output_token_logprobs"]
    r = relayed_with_eager(pdd, lambda _: body, 10, main_extra={"handoff": "catch-up", "chunk": 3})
    assert r.relay["meta_info"]["finish_reason"]["type"] == "pdd_handoff"
    got = r.main["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in got] == [t[1] for t in ref], f"k={r.k}"
    assert max(abs(a[0] - b[0]) for a, b in zip(got, ref)) < 1e-3, f"k={r.k}"


def test_adaptive_mode_is_chosen_on_the_relay_and_counted(pdd, reference_server, prompts):
    before = relay_counter(pdd, "sglang_pdd_handoff_mode_total")
    check(pdd, reference_server, prompts.ids(120, seed=130), n=200, main_delay_s=0.6,
          main_extra={"handoff": "adaptive", "chunk": 2})
    modes = {(dict(k)["mode"], dict(k)["reason"]): v for k, v in metric(pdd.relay, "sglang_pdd_handoff_mode_total").items()}
    assert relay_counter(pdd, "sglang_pdd_handoff_mode_total") == before + 1
    # MD runs this request alone: a one-shot EXTEND stalls nobody (or all its tokens fit one chunk)
    assert modes.get(("one-shot", "md_small_batch"), 0) + modes.get(("one-shot", "fits_one_chunk"), 0) >= 1
    inputs = {dict(k)["input"]: v for k, v in metric(pdd.relay, "sglang_pdd_handoff_policy_input").items()}
    assert set(inputs) == {"rld_running", "rld_kv_usage", "md_batch"} and inputs["rld_running"] >= 1
