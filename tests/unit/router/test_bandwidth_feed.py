"""The router's bandwidth estimate follows the transfers prefill completed over the WAN paths."""

from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.router.bandwidth_feed import TransferRateFeed, wan_totals


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
