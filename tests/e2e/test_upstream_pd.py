"""Upstream PD (prefill + decode over mooncake_tcp) with the plugin installed is token-identical
to a single server, through the upstream router; and the comparison fails when the KV never arrives."""

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import fake_transfer_generate, greedy_body, greedy_ids
from sglang_pdd.lab.testing.servers import http_json

from .cluster import start_pd

pytestmark = pytest.mark.e2e

NEW_TOKENS = 32
PROMPTS = [(7, 11), (300, 12), (1600, 13)]  # (tokens, seed)


@pytest.fixture(scope="module")
def pd(server_group, tiny_model):
    return start_pd(server_group, tiny_model, base_port=30100, bootstrap_port=8998, router=True)


def test_pd_through_router_is_token_identical_to_single_server(pd, reference_server, prompts):
    for n, seed in PROMPTS:
        ids = prompts.ids(n, seed)
        want = identity.reference(reference_server.url, ids, NEW_TOKENS)
        identity.check(want, greedy_ids(pd.router.url, ids, NEW_TOKENS), f"upstream PD, prompt of {n} tokens")


def test_negative_control_decode_without_kv_differs(pd, reference_server, prompts):
    ids = prompts.ids(300, seed=99)  # never served before: no stale KV of it in decode's pool
    want = identity.reference(reference_server.url, ids, NEW_TOKENS)
    got = fake_transfer_generate(pd.decode.url, greedy_body(ids, NEW_TOKENS))["output_ids"]
    assert len(got) == NEW_TOKENS
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(want, got, "decode without the KV")


def test_bad_input_through_router_is_rejected_and_pd_keeps_serving(pd, reference_server, prompts):
    status, body = http_json(pd.router.url + "/generate", greedy_body([5, 10 ** 6, 7], 4))
    assert status >= 400, body
    ids = prompts.ids(40, seed=5)
    identity.check(identity.reference(reference_server.url, ids, 8), greedy_ids(pd.router.url, ids, 8), "after")
    assert pd.prefill.alive() and pd.decode.alive()


def test_streaming_through_router_gives_the_same_tokens(pd, reference_server, prompts):
    from sglang_pdd.lab.testing.client import stream_generate

    ids = prompts.ids(500, seed=14)
    out = stream_generate(pd.router.url, greedy_body(ids, NEW_TOKENS))
    identity.check(identity.reference(reference_server.url, ids, NEW_TOKENS), out["output_ids"], "streamed")
    assert out["ttft_s"] is not None and out["ttft_s"] <= out["e2e_s"]
