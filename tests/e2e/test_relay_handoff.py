"""The core of PDD on real sglang: RLD streams t1..tk, hands over by token IDs, MD runs ONE EXTEND
over them and continues; RLD's t1..tk followed by MD's tokens equal a single server's greedy output."""

import threading

import pytest

from sglang_pdd.testing.client import greedy_body, greedy_ids
from sglang_pdd.testing.launch_args import ServerConfig
from sglang_pdd.testing.pdd_client import Roles, relayed_generate

pytestmark = pytest.mark.e2e

TOKEN_PORT = 18500
NEW = 64


@pytest.fixture(scope="module")
def pdd(server_group, tiny_model):
    base, boot = 30700, 8997
    p = server_group.start("pdd-prefill", ServerConfig(
        model=tiny_model, port=base, nccl_port=base + 1000, mode="prefill", bootstrap_port=boot,
        extra=["--pdd-role", "prefill"]))
    rld = server_group.start("pdd-relay", ServerConfig(
        model=tiny_model, port=base + 1, nccl_port=base + 1001, mode="decode", bootstrap_port=boot,
        extra=["--pdd-role", "relay", "--pdd-token-port", str(TOKEN_PORT), "--pdd-handoff-timeout", "20"]))
    md = server_group.start("pdd-main", ServerConfig(
        model=tiny_model, port=base + 2, nccl_port=base + 1002, mode="decode", bootstrap_port=boot,
        decode_radix_cache=True, extra=["--pdd-role", "main", "--pdd-handoff-timeout", "20"]))
    for s in (p, rld, md):
        s.wait_ready()
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


def test_handoff_at_k1_when_main_is_ready_before_relay_decodes(pdd, reference_server, prompts):
    r = check(pdd, reference_server, prompts.ids(300, seed=31), relay_delay_s=1.5)
    assert r.k == 1


@pytest.mark.parametrize("n_prompt, main_delay", [(40, 0.4), (700, 0.8), (1500, 1.6)])
def test_handoff_after_relay_decoded_eager_tokens(pdd, reference_server, prompts, n_prompt, main_delay):
    r = check(pdd, reference_server, prompts.ids(n_prompt, seed=n_prompt), n=160, main_delay_s=main_delay)
    assert 1 <= r.k < 160


def test_concurrent_handoffs_share_one_extend_step(pdd, reference_server, prompts):
    cases = [prompts.ids(200 + 50 * i, seed=40 + i) for i in range(4)]
    out = [None] * len(cases)

    def one(i):
        out[i] = check(pdd, reference_server, cases[i], relay_delay_s=1.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in out)


def test_relay_finishing_first_tells_main_which_lets_go(pdd, reference_server, prompts):
    ids = prompts.ids(120, seed=50)
    expected = greedy_ids(reference_server.url, ids, 8)
    r = relayed_generate(pdd, greedy_body(ids, 8), main_delay_s=1.5)
    assert r.relay["meta_info"]["finish_reason"]["type"] == "length"
    assert r.tokens == expected
    assert "error" in r.main or r.main["meta_info"]["finish_reason"]["type"] == "abort"
