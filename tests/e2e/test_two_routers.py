"""Two PDD routers serving one cluster (issue 35 item 2, docs/router-replicas.md): one P, one RLD, one
MD and two router processes pointed at the same roles, each building its own view (MD's cache from
MD's KV events, the WAN bandwidth from P's transfer counters, the load from every role's gauges).
Clients through both routers at once, relayed (a forced handoff each) and direct: every output is
the single server's, each router counts its own requests only, and every pool is idle afterwards."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import greedy_body, stream_generate
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import decode_roles_idle, metric
from .router_checks import EAGER
from .shared_cluster import KEYED, MD_EVENTS, MD_EVENTS_REPLAY, ROLE_KEY, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(KEYED)]

BASE = 32200  # the routers': BASE + 3, BASE + 4
N = 96  # as the router module: with fewer, RLD could finish before MD is ready to take over
# per router: (pdd_pipeline, streamed); relay forces P->RLD->MD (a handoff at k >= EAGER), direct P->MD,
# None leaves the choice to the router's pipeline policy
JOBS = (("relay", True), ("relay", False), ("direct", True), (None, False))


@pytest.fixture(scope="module")
def two(request, shared_clusters, server_group, tiny_model):
    """The shared cluster's MD publishes its KV events (shared_cluster.KEYED); each router subscribes, and
    calls the roles with their key."""
    pdd = cluster_for(request, shared_clusters, tiny_model)
    pdd.set_knobs("relay", relay_min_eager=EAGER)
    routers = [server_group.start(f"pdd-router-{BASE + 3 + i}", PddRouterConfig(
        prefill=[(pdd.prefill.url, pdd.bootstrap_port)], relay=[(pdd.relay.url, pdd.token_port)],
        main=[pdd.main.url], tokenizer=tiny_model, port=BASE + 3 + i, pipeline="auto",
        extra=["--main-kv-events", f"tcp://127.0.0.1:{MD_EVENTS}", f"tcp://127.0.0.1:{MD_EVENTS_REPLAY}",
               "--bandwidth-poll-s", "0.5", "--load-poll-s", "0.5"], role_api_key=ROLE_KEY, openai_frontend="builtin"))
        for i in range(2)]
    for r in routers:
        r.wait_ready()
    return pdd, routers


def _requests(url: str) -> dict:
    """A router's sglang_pdd_router_requests_total as {(pipeline, outcome): n}."""
    return {(dict(k)["pipeline"], dict(k)["outcome"]): v
            for k, v in metric(url, "sglang_pdd_router_requests_total").items()}


def _handoffs_on_main(pdd) -> float:
    return sum(metric(pdd.main.url, "sglang_pdd_handoffs_total").values())


def _in_flight_anywhere(routers) -> dict:
    return {(r.url, dict(k).get("peer")): v for r in routers
            for k, v in metric(r.url, "sglang_pdd_router_peer_in_flight").items() if v}


def _send(url: str, ids: list[int], pipeline: str | None, stream: bool) -> dict:
    body = {**greedy_body(ids, N), **({"pdd_pipeline": pipeline} if pipeline else {})}
    if stream:
        return stream_generate(url, body)
    status, out = http_json(url + "/generate", body, timeout=300)
    assert status == 200, out
    return out


def test_two_routers_serve_one_cluster_token_identically_each_counting_its_own(two, reference_server, prompts):
    pdd, routers = two
    jobs = [(i, pipe, stream, prompts.ids(300 + 40 * j, seed=900 + 10 * i + j))
            for i in range(2) for j, (pipe, stream) in enumerate(JOBS)]
    refs = [identity.reference(reference_server.url, ids, N) for *_, ids in jobs]
    before = [_requests(r.url) for r in routers]
    handoffs = _handoffs_on_main(pdd)
    with ThreadPoolExecutor(len(jobs)) as pool:  # every client at once, half through each router
        outs = list(pool.map(lambda j: _send(routers[j[0]].url, j[3], j[1], j[2]), jobs))

    want: list[dict] = [{}, {}]
    for (i, pipe, stream, _), ref, out in zip(jobs, refs, outs):
        what = f"router {i} {pipe or 'auto'}{' stream' if stream else ''}"
        identity.check(ref, out["output_ids"], what)
        meta = ReplyMeta.of(out["meta_info"])
        assert meta.migrations == 0, (what, meta)
        if pipe == "relay":
            assert meta.pipeline == "P->RLD->MD" and meta.handoff_tokens >= EAGER, (what, meta)
        elif pipe == "direct":
            assert meta.pipeline == "P->MD" and meta.handoff_tokens is None, (what, meta)
        want[i][(meta.pipeline, "ok")] = want[i].get((meta.pipeline, "ok"), 0) + 1
    relayed = sum(pipe == "relay" for _, pipe, _, _ in jobs)
    assert _handoffs_on_main(pdd) - handoffs == relayed  # one handoff per relayed request, whichever router
    for r, b, w in zip(routers, before, want):  # each router counted exactly its own clients' requests
        got = {k: v - b.get(k, 0) for k, v in _requests(r.url).items() if v - b.get(k, 0)}
        assert got == w, (r.url, got, w)

    deadline = time.monotonic() + 60  # the routers let go of every peer (no request of either left)
    while _in_flight_anywhere(routers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _in_flight_anywhere(routers) == {}
    assert decode_roles_idle(pdd) == []  # RLD's and MD's rows, KV pool and handoff table back to idle


def test_each_router_builds_its_own_exact_view_of_mds_cache(two):
    """Both subscribe to MD's KV events (PUB/SUB: every subscriber gets every event) and replayed its
    cache at start: neither needs the other's record of what it sent."""
    _, routers = two
    for r in routers:
        assert any("exact view of MD's cache" in line for line in r.log_text().splitlines()), r.url
        assert list(metric(r.url, "sglang_pdd_router_md_kv_events_exact").values()) == [1.0], r.url
        assert list(metric(r.url, "sglang_pdd_router_md_kv_events_seq").values())[0] >= 0, r.url
        assert sum(metric(r.url, "sglang_pdd_router_wan_bandwidth_estimate_bytes_per_second").values()) > 0
