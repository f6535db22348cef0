"""Decode with the upstream decode radix cache (the future MainDecode): on the second turn of a
conversation only the KV that decode lacks moves, counted by the transfer layer; output stays
token-identical. Runs with --pdd-role prefill / main, which are inert until the core lands."""

import pytest

from sglang_pdd.metrics import parse_exposition
from sglang_pdd.testing.client import greedy_body, greedy_ids, pd_generate
from sglang_pdd.testing.servers import http_json

from .cluster import kv_bytes_per_token, start_pd

pytestmark = pytest.mark.e2e

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def drc(server_group, tiny_model):
    return start_pd(server_group, tiny_model, base_port=30400, bootstrap_port=8999, decode_radix_cache=True,
                       prefill_extra=["--pdd-role", "prefill"], decode_extra=["--pdd-role", "main"])


def kv_bytes_sent(prefill) -> int:
    status, text = http_json(prefill.url + "/metrics")
    assert status == 200
    samples = parse_exposition(text, "sglang_pdd_transfer_bytes_total")
    return int(sum(v for labels, v in samples.items() if dict(labels).get("kind") == "kv"))


def turn(drc, ids):
    return pd_generate(drc.prefill.url, drc.decode.url, "127.0.0.1", drc.bootstrap_port,
                       greedy_body(ids, NEW_TOKENS))["output_ids"]


def test_second_turn_moves_only_the_kv_decode_lacks(drc, reference_server, prompts, tiny_model):
    kvb = kv_bytes_per_token(tiny_model)
    first = prompts.ids(1200, seed=21)
    before = kv_bytes_sent(drc.prefill)
    out1 = turn(drc, first)
    moved1 = kv_bytes_sent(drc.prefill) - before
    assert out1 == greedy_ids(reference_server.url, first, NEW_TOKENS)
    assert moved1 == len(first) * kvb  # cold decode cache: the whole prompt

    appended = prompts.ids(100, seed=22)
    second = first + out1 + appended
    out2 = turn(drc, second)
    moved2 = kv_bytes_sent(drc.prefill) - before - moved1
    assert out2 == greedy_ids(reference_server.url, second, NEW_TOKENS)
    # decode cached prompt + outputs except the last output's KV (never computed there)
    assert len(appended) * kvb <= moved2 <= (len(appended) + 1) * kvb
    assert moved2 * 10 < moved1


def test_roles_are_announced_in_the_server_logs(drc):
    assert any("sglang-pdd" in l and "role=prefill" in l for l in drc.prefill.log_text().splitlines())
    assert any("sglang-pdd" in l and "role=main" in l for l in drc.decode.log_text().splitlines())
