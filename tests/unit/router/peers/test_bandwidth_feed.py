"""The router's bandwidth estimate follows the transfers prefill completed over the WAN paths."""

from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.router.peers.bandwidth_feed import TransferRateFeed, wan_totals


def page(main_bytes, main_s, batches, relay_bytes=0.0):
    return "\n".join([
        "# HELP sglang_pdd_transfer_bytes_total x",
        f'sglang_pdd_transfer_bytes_total{{kind="kv",path="main",peer="md:1"}} {main_bytes}',
        f'sglang_pdd_transfer_bytes_total{{kind="kv",path="relay",peer="rld:1"}} {relay_bytes}',
        f'sglang_pdd_transfer_bytes_total{{kind="aux",path="main",peer="md:1"}} 123',
        f'sglang_pdd_transfer_seconds_total{{kind="kv",path="main"}} {main_s}',
        f'sglang_pdd_transfer_seconds_total{{kind="kv",path="relay"}} 9.0',
        f'sglang_pdd_transfer_batches_total{{kind="kv",path="main",peer="md:1"}} {batches}',
    ])


def test_wan_totals_count_kv_on_wan_paths_only():
    text = page(10e6, 2.0, 4, relay_bytes=5e9) + '\nsglang_pdd_transfer_bytes_total{kind="kv",path="direct",peer="x:1"} 7e9'
    assert wan_totals(text) == {"bytes": 10e6, "seconds": 2.0, "batches": 4}  # direct may be the LAN


def test_feed_moves_the_estimate_towards_the_observed_rate():
    est = BandwidthEstimator(initial_bytes_per_s=100e6, alpha=1.0, rtt_s=0.01)
    feed = TransferRateFeed(est)
    feed.update("p", page(0, 0, 0))
    assert est.observations == 0  # the first page is only a baseline
    feed.update("p", page(20e6, 2.04, 4))  # 20 MB in 2.04 s over 4 batches: 2.0 s of data after RTTs
    assert abs(est.bytes_per_s - 10e6) < 1e3 and feed.samples == 1


def test_small_windows_accumulate_and_restarts_reset():
    est = BandwidthEstimator(initial_bytes_per_s=100e6, alpha=1.0, min_bytes=1 << 20)
    feed = TransferRateFeed(est)
    feed.update("p", page(0, 0, 0))
    feed.update("p", page(600e3, 0.06, 1))  # too small alone: carried into the next window
    assert est.observations == 0
    feed.update("p", page(1.2e6, 0.12, 2))
    assert est.observations == 1 and abs(est.bytes_per_s - 10e6) < 1e3
    feed.update("p", page(0, 0, 0))  # counters went back: the server restarted
    assert est.observations == 1


def test_feed_tells_each_site_link_what_p_lane_holds_for_it():
    from sglang_pdd.policy.site_links import SiteLinks
    from sglang_pdd.router.peers.bandwidth_feed import queued_by_site

    links = SiteLinks.single(BandwidthEstimator(1e6), 0.0)
    links.add("b", 1e6, 0.0)
    text = "\n".join([
        'sglang_pdd_lane_queued_bytes{path="main",peer="10.0.0.2:7002"} 3000000',
        'sglang_pdd_lane_queued_bytes{path="main",peer="10.0.0.2:7003"} 1000000',
        'sglang_pdd_lane_queued_bytes{path="main",peer="10.9.0.1:7002"} 5',
    ])
    site_of = {"10.0.0.2": "b"}.get
    assert queued_by_site(text, lambda h: site_of(h, "")) == {"b": 4e6, "": 5.0}
    feed = TransferRateFeed(links, site_of=lambda h: site_of(h, ""))
    feed.update("http://p:1", text)
    assert links.of("b").queued_bytes("http://p:1") == 4e6 and links.of("").queued_bytes("http://p:1") == 5.0
    feed.update("http://p:1", page(0, 0, 0))  # lanes drained: no gauge on the page holds nothing
    assert links.of("b").queued_bytes("http://p:1") == 0


def direct_page(md_bytes, md_s, md_batches, rld_bytes=0.0, rld_s=0.0):
    """P->MD's plain-PD batches to the MD at 10.0.0.2, and (odd traffic) to the RLD at 10.0.0.1."""
    return "\n".join([
        f'sglang_pdd_transfer_bytes_total{{kind="kv",path="direct",peer="10.0.0.2:7002"}} {md_bytes}',
        f'sglang_pdd_transfer_seconds_total{{kind="kv",path="direct",peer="10.0.0.2:7002"}} {md_s}',
        f'sglang_pdd_transfer_batches_total{{kind="kv",path="direct",peer="10.0.0.2:7002"}} {md_batches}',
        f'sglang_pdd_transfer_bytes_total{{kind="kv",path="direct",peer="10.0.0.1:7001"}} {rld_bytes}',
        f'sglang_pdd_transfer_seconds_total{{kind="kv",path="direct",peer="10.0.0.1:7001"}} {rld_s}',
        f'sglang_pdd_transfer_batches_total{{kind="kv",path="direct",peer="10.0.0.1:7001"}} {1 if rld_bytes else 0}',
    ])


def test_plain_pd_counts_towards_wan_hosts_only():
    from sglang_pdd.policy.site_links import SiteLinks

    est = BandwidthEstimator(initial_bytes_per_s=100e6, alpha=1.0)
    links = SiteLinks.single(est, 0.0)
    feed = TransferRateFeed(links)
    feed.update("p", direct_page(0, 0, 0))
    feed.update("p", direct_page(10e6, 2.0, 1, rld_bytes=500e6, rld_s=0.5))  # MD not a WAN host yet: ignored
    assert est.observations == 0
    links.wan_hosts = frozenset({"10.0.0.2"})
    feed.update("p", direct_page(20e6, 4.0, 2, rld_bytes=1000e6, rld_s=1.0))  # 10 MB in 2 s to MD; RLD's LAN left out
    assert est.observations == 1 and abs(est.bytes_per_s - 5e6) < 1e3


def test_a_series_that_appears_on_a_later_page_counts_from_zero():
    est = BandwidthEstimator(initial_bytes_per_s=100e6, alpha=1.0, rtt_s=0.0)
    feed = TransferRateFeed(est)
    feed.update("p", "")  # P's first page: no transfer yet
    feed.update("p", page(20e6, 2.0, 1))  # its first main-leg transfer: a sample, not a baseline
    assert est.observations == 1 and abs(est.bytes_per_s - 10e6) < 1e3
