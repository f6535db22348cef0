"""P -> MD with the decode radix cache, pages of 64 tokens: on the second turn of a conversation only
the pages MD lacks move, counted by the transfer layer, and the output stays token-identical (greedy
and seeded), for prompts that end on a page boundary and one token past it. The negative control
(last: it corrupts MD's cache) zeroes the KV of the prefix MD reuses, and the comparison catches it."""

import json
import math
import os

import pytest

from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, pd_generate

from .cluster import kv_bytes_per_token, kv_bytes_sent, start_pd

pytestmark = pytest.mark.e2e

NEW_TOKENS = 16
PAGE = 64
KNOBS: dict[str, str] = {}


@pytest.fixture(scope="module")
def drc(server_group, tiny_model):
    KNOBS["main"] = os.path.join(server_group.log_dir, "drc-main-knobs.json")
    set_knobs()
    return start_pd(server_group, tiny_model, base_port=30400, bootstrap_port=8999, decode_radix_cache=True,
                    page_size=PAGE, prefill_extra=["--pdd-role", "prefill"], decode_extra=["--pdd-role", "main"],
                    decode_env={ENV_TEST_KNOBS: KNOBS["main"]})


def set_knobs(**knobs) -> None:
    with open(KNOBS["main"] + ".tmp", "w") as f:
        json.dump(knobs, f)
    os.replace(KNOBS["main"] + ".tmp", KNOBS["main"])


def turn(drc, ids, n=NEW_TOKENS, **sp) -> dict:
    return pd_generate(drc.prefill.url, drc.decode.url, "127.0.0.1", drc.bootstrap_port, greedy_body(ids, n, **sp))


def pages(tokens: int) -> int:
    return math.ceil(tokens / PAGE) * PAGE


def conversation(drc, reference_server, prompts, kvb, n_first: int, seed: int, **sp):
    """Two turns; returns (second prompt, MD's second output). Checks identity and the bytes moved."""
    first = prompts.ids(n_first, seed=seed)
    before = kv_bytes_sent(drc.prefill.url)
    out1 = turn(drc, first, **sp)
    moved1 = kv_bytes_sent(drc.prefill.url) - before
    identity.check(identity.reference(reference_server.url, first, NEW_TOKENS, **sp), out1["output_ids"], "turn 1")
    assert moved1 == pages(len(first)) * kvb  # cold decode cache: the whole prompt, in whole pages
    second = first + out1["output_ids"] + prompts.ids(100, seed=seed + 1)
    out2 = turn(drc, second, **sp)
    moved2 = kv_bytes_sent(drc.prefill.url) - before - moved1
    identity.check(identity.reference(reference_server.url, second, NEW_TOKENS, **sp), out2["output_ids"], "turn 2")
    # MD cached turn 1's prompt and output but the last output token's KV (never computed there), whole pages
    cached = (len(first) + NEW_TOKENS - 1) // PAGE * PAGE
    assert out2["meta_info"]["cached_tokens"] >= cached
    assert moved2 == (pages(len(second)) - cached) * kvb, (moved2 // kvb, cached)
    return second, out2


@pytest.mark.parametrize("n_first", [1280, 1281, 1200], ids=["on-a-page-boundary", "one-past", "mid-page"])
def test_second_turn_moves_only_the_pages_decode_lacks(drc, reference_server, prompts, tiny_model, n_first):
    conversation(drc, reference_server, prompts, kv_bytes_per_token(tiny_model), n_first, seed=n_first)


def test_seeded_sampling_through_the_decode_cache(drc, reference_server, prompts, tiny_model):
    conversation(drc, reference_server, prompts, kv_bytes_per_token(tiny_model), 700, seed=23,
                 temperature=0.8, top_p=0.9, sampling_seed=99)


def test_roles_are_announced_in_the_server_logs(drc):
    assert any("sglang-pdd" in l and "role=prefill" in l for l in drc.prefill.log_text().splitlines())
    assert any("sglang-pdd" in l and "role=main" in l for l in drc.decode.log_text().splitlines())


def test_negative_control_a_corrupted_cached_prefix_is_caught(drc, reference_server, prompts, tiny_model):
    """Last in the module: MD's cached prefix is zeroed for turn 2, so its tokens must differ."""
    first = prompts.ids(900, seed=25)
    identity.check(identity.reference(reference_server.url, first, NEW_TOKENS), turn(drc, first)["output_ids"])
    second = first + prompts.ids(120, seed=26)
    want = identity.reference(reference_server.url, second, NEW_TOKENS)
    set_knobs(corrupt_cached_prefix=True)
    try:
        out = turn(drc, second)
    finally:
        set_knobs()
    assert out["meta_info"]["cached_tokens"] >= len(first) // PAGE * PAGE
    assert "zeroed the" in drc.decode.log_text()
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(want, out["output_ids"], "DRC control")
