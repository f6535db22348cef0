"""P's main lane shows the KV bytes it still holds for MD (`sglang_pdd_lane_queued_bytes`) on real sglang:
the router's queue-aware WAN prediction reads that gauge (policy.wan_queue, router.bandwidth_feed).

A slow WAN write (the test knob `main_write_delay`) keeps the request's main-leg chunk on the lane: the gauge
shows its bytes under MD's session while it is written, and nothing once it is."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_pdd.metrics import parse_exposition
from sglang_pdd.lab.testing.servers import http_json

from .fanout_cluster import (  # noqa: F401  (fan1 and the autouse figures are fixtures)
    SLOW_MAIN_WRITE, assert_same, fan1, fanout_generate, figures, moved, path_bytes, reference)

pytestmark = pytest.mark.e2e


def lane_queued(fan) -> dict[str, float]:
    status, text = http_json(fan.prefill.url + "/metrics")
    assert status == 200
    return {dict(k).get("peer", ""): v for k, v in parse_exposition(text, "sglang_pdd_lane_queued_bytes").items()}


def test_the_lane_gauge_holds_the_main_leg_bytes_until_they_are_written(fan1, reference_server, prompts):
    ids = prompts.ids(300, seed=861)  # never seen by MD: its whole prompt crosses
    expected = fan1.main_miss_bytes(ids)
    fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
    out: dict = {}
    try:
        before = path_bytes(fan1)
        t = threading.Thread(target=lambda: out.update(fanout_generate(fan1, ids)))
        t.start()
        peak: dict[str, float] = {}
        while t.is_alive():  # the request ends within its own deadline; the gauge is read meanwhile
            for peer, v in lane_queued(fan1).items():
                peak[peer] = max(peak.get(peer, 0.0), v)
            time.sleep(0.1)
        t.join()
        after = path_bytes(fan1)
    finally:
        fan1.set_knobs()
    assert_same(reference(reference_server, ids), out["main"], "slow main: the main")
    main_kv = moved(before, after, "main")
    assert main_kv == expected > 0
    assert list(peak.values()) and max(peak.values()) == main_kv, peak  # one lane, the main's session
    deadline = time.monotonic() + 30  # the worker is back at its queue once the write is done
    while any(lane_queued(fan1).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(lane_queued(fan1).values()), lane_queued(fan1)
