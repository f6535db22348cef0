"""The packed WAN path on the MLA model (DeepSeek-V3 architecture): P packs each chunk's latent rows (one
buffer per layer, `kv_lora_rank + qk_rope_head_dim` values per token, no K/V split) into MD's landing
region, MD unpacks them into its `MLATokenToKVPool` pages. Token identity against a single MLA server is
the proof (plain P->MD, and the fan-out's main leg of a relayed request handed over at k >= 4); P's and
MD's counters show the packed path was taken; MD skipping the unpack is the negative control."""

import time

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, pd_generate
from sglang_pdd.lab.testing.pdd_client import relayed_generate

from . import mla_cluster
from .cluster import decode_roles_idle, metric

pytestmark = pytest.mark.e2e

BASE = 32100
TOKEN_PORT = 18760
PAGE = 16
NEW = 24
RELAYED_NEW = 64


@pytest.fixture(scope="module")
def cluster(server_group, mla_model, mla_reference):
    flags = ("--pdd-packed-wan", "plain")
    pdd = mla_cluster.start_mla_pdd(server_group, mla_model, base_port=BASE, bootstrap_port=8986,
                                    token_port=TOKEN_PORT, handoff_timeout=30, page_size=PAGE,
                                    prefill_extra=flags, main_extra=flags)
    pdd.set_knobs("relay", relay_min_eager=4)
    pdd.reference = mla_reference
    return pdd


def events(url: str, side: str) -> dict[str, float]:
    return {dict(k)["event"]: v for k, v in metric(url, "sglang_pdd_packed_wan_events_total").items()
            if dict(k).get("side") == side}


def delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def direct(cluster, ids):
    r = cluster.roles
    return pd_generate(r.prefill, r.main, r.bootstrap_host, r.bootstrap_port, greedy_body(ids, NEW))


def test_plain_pd_to_main_goes_packed_and_is_token_identical(cluster, mla_prompts):
    ids = mla_prompts.ids(500, seed=801)  # 32 pages of 16 latent rows
    p0, m0 = events(cluster.prefill.url, "prefill"), events(cluster.main.url, "main")
    out = direct(cluster, ids)
    identity.check(identity.reference(cluster.reference.url, ids, NEW), out["output_ids"], "packed MLA P->MD")
    p1, m1 = events(cluster.prefill.url, "prefill"), events(cluster.main.url, "main")
    assert delta(p1, p0, "packed") >= 1, p1
    assert delta(m1, m0, "offered") == 1 and delta(m1, m0, "unpacked") == 1, m1
    assert not [e for e in p1 if e.startswith("page by page") and delta(p1, p0, e)], p1


def test_the_fanout_main_leg_goes_packed_and_md_continues_identically(cluster, mla_prompts):
    ids = mla_prompts.ids(400, seed=802)
    m0 = events(cluster.main.url, "main")
    r = relayed_generate(cluster.roles, greedy_body(ids, RELAYED_NEW), fanout=True)
    want = identity.reference(cluster.reference.url, ids, RELAYED_NEW)
    assert r.handed_over and r.k >= 4, (r.k, r.relay["meta_info"]["finish_reason"])
    identity.check(want, r.relay["output_ids"], "RLD's eager tokens", prefix=True)
    identity.check(want, r.main["output_ids"], "MD after its packed fan-out leg")
    assert delta(events(cluster.main.url, "main"), m0, "unpacked") == 1


def test_negative_control_main_without_the_unpack_diverges(cluster, mla_prompts):
    """MD leaves P's blocks in the landing region: its latent pages hold no KV, so its output must differ."""
    ids = mla_prompts.ids(500, seed=803)
    with cluster.knobs("main", packed_skip_unpack=True):
        p0 = events(cluster.prefill.url, "prefill")
        out = direct(cluster, ids)
        assert delta(events(cluster.prefill.url, "prefill"), p0, "packed") >= 1
    with pytest.raises(AssertionError, match="diverges from the single server"):
        identity.check(identity.reference(cluster.reference.url, ids, NEW), out["output_ids"], "MLA packed control")


def test_landing_arena_and_decode_roles_are_idle_afterwards(cluster):
    def landing():
        return {dict(k)["what"]: v for k, v in metric(cluster.main.url, "sglang_pdd_packed_wan_landing").items()}

    deadline = time.monotonic() + 30  # a room RLD finished may still be landing on MD
    while landing().get("rooms") and time.monotonic() < deadline:
        time.sleep(0.2)
    got = landing()
    assert got.get("rooms") == 0 and got.get("bytes") == 0 and got.get("quarantined") == 0, got
    assert decode_roles_idle(cluster) == []
