"""Which server of a pool gets a request: cache hit against load, the guards, sites, the router's wiring."""

import pytest

from sglang_pdd.router.cache.exact_view import ExactCacheView
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.peer_choice import Candidate, ChoiceConfig, PeerChooser
from sglang_pdd.policy.pipeline import PipelinePolicy, PipelinePolicyConfig
from sglang_pdd.policy.site_links import SiteLinks
from sglang_pdd.router.peers import load_feed
from sglang_pdd.router.__main__ import _peer_args, _site_links, build_parser
from sglang_pdd.router.peers.bandwidth_feed import TransferRateFeed
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.peers.placement import Placement

MB = 1e6


def cands(*specs, **common):
    return [Candidate(f"md{i}", **{**common, **s}) for i, s in enumerate(specs)]


def test_hit_beats_load_until_the_imbalance_threshold():
    ch = PeerChooser(ChoiceConfig(balance_abs=8, balance_rel=1.5))
    # md0 holds the whole prompt but runs more: the hit wins (WAN seconds saved > load cost)
    c = ch.choose(cands(dict(hit=1000, load=6, wan_s=0.02), dict(hit=0, load=0, wan_s=2.0)), 1000)
    assert c.index == 0 and "cache-aware" in c.reason
    # 9 more requests than the idlest and more than 1.5x: balance, whatever the hit
    c = ch.choose(cands(dict(hit=1000, load=9, wan_s=0.02), dict(hit=0, load=0, wan_s=2.0)), 1000)
    assert c.index == 1 and "imbalanced" in c.reason
    # the relative guard: 29 vs 20 is 9 apart but under 1.5x -> still the cache
    c = ch.choose(cands(dict(hit=1000, load=29, wan_s=0.02), dict(hit=0, load=20, wan_s=2.0)), 1000)
    assert c.index == 0


def test_without_a_wan_estimate_the_missed_fraction_is_the_cost():
    ch = PeerChooser()
    c = ch.choose(cands(dict(hit=100), dict(hit=900, load=2)), 1000)
    assert c.index == 1  # 0.9 of the prompt missed costs more than two running requests


def test_a_stale_view_falls_back_to_balancing():
    ch = PeerChooser()
    c = ch.choose(cands(dict(hit=1000, load=3, wan_s=0.0), dict(hit=0, load=1, wan_s=2.0, fresh=False)), 1000)
    assert c.index == 1 and "stale" in c.reason


def test_a_dead_server_is_never_chosen():
    ch = PeerChooser()
    c = ch.choose(cands(dict(hit=1000, load=0, healthy=False), dict(hit=0, load=50)), 1000)
    assert c.index == 1
    for policy in ("least-loaded", "round-robin"):
        rr = PeerChooser(ChoiceConfig(policy))
        picks = {rr.choose(cands(dict(healthy=False), dict(load=5), dict(load=9)), 10).index for _ in range(6)}
        assert 0 not in picks
    with pytest.raises(LookupError, match="no healthy"):
        ch.choose(cands(dict(healthy=False)), 10)


def test_least_loaded_ignores_the_cache_and_round_robin_cycles():
    two = cands(dict(hit=1000, load=1), dict(hit=0, load=0))
    assert PeerChooser(ChoiceConfig("least-loaded")).choose(two, 1000).index == 1
    rr = PeerChooser(ChoiceConfig("round-robin"))
    assert [rr.choose(two, 1000).index for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown peer policy"):
        ChoiceConfig("hash")


def _placement(policy_name="cache-aware", sites=("", ""), links=None, kv_events=None):
    bw = BandwidthEstimator(100 * MB)
    links = links or SiteLinks.single(bw, 0.02)
    pol = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=16384), links.default.bandwidth, 0.02, links)
    main = PeerPool("main", [Peer(f"http://md{i}:1", site=s) for i, s in enumerate(sites)], policy_name)
    return Placement(PeerPool("prefill", [Peer("http://p:1", bootstrap_port=1)], policy_name),
                     PeerPool("relay", [Peer("http://r:1", token_channel="tcp://r:2")], policy_name), main, pol,
                     kv_events)


def _turns(pl: Placement, n_turns=4, base=0):
    """A conversation: each turn's prompt extends the previous turn's prompt + output."""
    seen, prompt = [], list(range(base, base + 500))
    for t in range(n_turns):
        mc = pl.pick_main(prompt)
        mc.peer.in_flight += 1  # another request keeps it busier than the other MD
        seen.append(mc.index)
        out = list(range(base + 10_000 + 100 * t, base + 10_000 + 100 * t + 50))
        pl.landed(mc.peer, prompt + out)
        prompt = prompt + out + list(range(base + 20_000 + 100 * t, base + 20_000 + 100 * t + 30))
    return seen


def test_a_conversation_stays_on_its_md_cache_aware_and_not_least_loaded():
    pl = _placement()
    pl.main.peers[0].in_flight = 1  # the first turn goes to the idler md1
    assert _turns(pl) == [1, 1, 1, 1]
    ll = _placement("least-loaded")
    ll.main.peers[0].in_flight = 1
    assert _turns(ll) != [1, 1, 1, 1]  # negative control: least-loaded sends turn 2 to md0


def test_the_choice_reports_what_it_saw():
    pl = _placement()
    pl.landed(pl.main.peers[1], list(range(300)))
    mc = pl.pick_main(list(range(400)))
    assert (mc.index, mc.hit, mc.hits, mc.prompt_len) == (1, 300, (0, 300), 400)
    assert mc.kind == "cache-aware" and mc.public()["hits"] == [0, 300] and "http" not in str(mc.public())


def test_a_stale_exact_view_sends_the_request_by_load():
    pl = _placement()
    stale = ExactCacheView(name="md0")
    stale.mark_stale("events lost")
    stale.insert(list(range(400)))  # its fallback would claim a full hit
    pl.views["http://md0:1"] = stale
    pl.main.peers[0].in_flight = 2
    mc = pl.pick_main(list(range(400)))
    assert mc.index == 1 and mc.kind == "stale"


def test_sites_the_faster_link_wins_equal_hits_and_a_session_keeps_its_site():
    bw = BandwidthEstimator(100 * MB)
    links = SiteLinks.single(bw, 0.02)
    links.add("far", 10 * MB, 0.1)
    links.add("near", 50 * MB, 0.005)
    pl = _placement(sites=("far", "near"), links=links)
    first = pl.pick_main(list(range(2000)))
    assert first.site == "near"  # 32.8 MB of KV: 0.66 s to near, 3.4 s to far
    pl.landed(pl.main.peers[0], list(range(2000)))  # but the session's history is in "far"
    again = pl.pick_main(list(range(2100)))
    assert again.site == "far" and again.hit == 2000  # 100 new tokens to far: 0.26 s; all 2100 to near: 0.69 s
    links.sites["near"].bandwidth._estimate = 400 * MB  # near's link got fast: moving pays this very turn
    moved = pl.pick_main(list(range(2100)))
    assert moved.site == "near" and moved.wan_s[1] < moved.wan_s[0]


def test_cli_main_sites_and_links():
    args = build_parser().parse_args(["--prefill", "http://p:1", "--main", "http://m:3", "b", "--main", "http://n:4",
                                      "--site", "b", "400", "30", "--tokenizer", "x"])
    mains = _peer_args(args.main, "main", None, "--main")
    assert [(m.url, m.site) for m in mains] == [("http://m:3", "b"), ("http://n:4", "")]
    links = _site_links(args.site, mains, BandwidthEstimator(1e8), 0.02)
    assert links.of("b").bandwidth.bytes_per_s == 50e6 and links.of("b").rtt_s == 0.03
    assert links.of("").bandwidth.bytes_per_s == 1e8
    with pytest.raises(SystemExit, match="site c has no --site"):
        _site_links([], [Peer("http://m:3", site="c")], BandwidthEstimator(1e8), 0.02)
    assert build_parser().parse_args(["--prefill", "http://p:1", "--main", "http://m:3", "--tokenizer",
                                      "x"]).peer_policy == "cache-aware"


def page(site_bytes: dict, site_s: dict):
    lines = []
    for host, b in site_bytes.items():
        lines.append(f'sglang_pdd_transfer_bytes_total{{kind="kv",path="main",peer="{host}:7"}} {b}')
        lines.append(f'sglang_pdd_transfer_batches_total{{kind="kv",path="main",peer="{host}:7"}} 1')
        lines.append(f'sglang_pdd_transfer_seconds_total{{kind="kv",path="main",peer="{host}:7"}} {site_s[host]}')
    return "\n".join(lines)


def test_the_bandwidth_feed_updates_each_sites_link():
    links = SiteLinks.single(BandwidthEstimator(100 * MB, alpha=1.0), 0.0)
    links.add("far", 100 * MB, 0.0)
    links.sites["far"].bandwidth.alpha = 1.0
    feed = TransferRateFeed(links, site_of={"10.0.0.9": "far"}.get)
    feed.update("p", page({"10.0.0.9": 0, "10.0.0.2": 0}, {"10.0.0.9": 0, "10.0.0.2": 0}))
    feed.update("p", page({"10.0.0.9": 20 * MB, "10.0.0.2": 50 * MB}, {"10.0.0.9": 2.0, "10.0.0.2": 1.0}))
    assert abs(links.of("far").bandwidth.bytes_per_s - 10 * MB) < 1e3
    assert abs(links.of("").bandwidth.bytes_per_s - 50 * MB) < 1e3


def test_load_feed_reads_sglangs_gauges():
    p = Peer("http://md:1")
    text = "\n".join(['sglang:num_running_reqs{model_name="m"} 3.0', 'sglang:num_queue_reqs{model_name="m"} 1.0',
                      'sglang:num_decode_transfer_queue_reqs{model_name="m"} 2.0',
                      'sglang:token_usage{model_name="m"} 0.25'])
    assert load_feed.update(p, text) and (p.running, p.kv_usage) == (6.0, 0.25)
    p.in_flight = 9
    assert p.load == 9.0
    assert not load_feed.update(p, "other_metric 1")  # no sglang gauges: the last figures stay
    assert p.running == 6.0


def test_cli_a_prefill_that_relays_names_its_token_port():
    args = build_parser().parse_args(["--prefill", "http://p:1", "9400", "18592", "--prefill", "http://q:2",
                                      "--main", "http://m:3", "--tokenizer", "x"])
    ps = _peer_args(args.prefill, "prefill", 8998, "--prefill")
    assert [(p.url, p.bootstrap_port, p.token_channel) for p in ps] == [
        ("http://p:1", 9400, "tcp://p:18592"), ("http://q:2", 8998, None)]
    with pytest.raises(SystemExit, match="BOOTSTRAP_PORT"):
        _peer_args([["http://p:1", "1", "2", "3"]], "prefill", 8998, "--prefill")
