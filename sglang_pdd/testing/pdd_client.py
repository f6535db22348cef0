"""Driving P, RLD and MD by hand, as the PDD router will (and as tests and benchmarks do before it).

One relayed request: P gets the prompt twice over one bootstrap server — room R for RLD and, in the
same body, `custom_params.pdd.main_room = R2` so its fan-out sender also feeds MD (room R2). Until
the fan-out lands, `fanout=False` sends P a second request for room R2 instead (P's radix cache makes
it cheap). RLD gets room R; MD gets room R2 with `relay_room = R` and RLD's token-channel address.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from sglang_pdd.protocol.request import RequestParams, with_params
from sglang_pdd.testing.client import GenerateError, generate


@dataclass
class Roles:
    prefill: str  # URL
    relay: str
    main: str
    bootstrap_host: str
    bootstrap_port: int
    token_channel: str  # tcp://host:port of RLD


@dataclass
class RelayedResult:
    relay: dict
    main: dict
    k: int
    tokens: list[int]  # the stitched stream: RLD's t1..tk, then MD's from k
    timings: dict = field(default_factory=dict)


def relayed_generate(roles: Roles, body: dict, *, fanout: bool = False, main_delay_s: float = 0.0,
                     relay_delay_s: float = 0.0, main_extra: dict | None = None) -> RelayedResult:
    """Send one request through P -> RLD -> MD; `*_delay_s` hold back one path to force k."""
    room, room2 = random.getrandbits(63), random.getrandbits(63)
    boot = {"bootstrap_host": roles.bootstrap_host, "bootstrap_port": roles.bootstrap_port}
    to_relay = {**body, **boot, "bootstrap_room": room}
    to_main = with_params({**body, **boot, "bootstrap_room": room2},
                            RequestParams(v=1, relay_room=room, relay=roles.token_channel, **(main_extra or {})))
    calls = []
    if fanout:
        calls.append(("prefill", roles.prefill, with_params(to_relay, RequestParams(v=1, main_room=room2)), relay_delay_s))
    else:
        calls.append(("prefill", roles.prefill, to_relay, relay_delay_s))
        calls.append(("prefill_main", roles.prefill, to_main, main_delay_s))
    calls.append(("relay", roles.relay, to_relay, relay_delay_s))
    calls.append(("main", roles.main, to_main, main_delay_s))
    results: dict[str, object] = {}
    t0 = time.monotonic()

    def call(name, url, b, delay):
        time.sleep(delay)
        try:
            results[name] = generate(url, b)
        except Exception as e:
            results[name] = e
        results[name + "_s"] = time.monotonic() - t0

    threads = [threading.Thread(target=call, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if isinstance(results["relay"], Exception):
        raise GenerateError(f"relay: {results['relay']}")
    relay, main = results["relay"], results["main"]
    reason = relay["meta_info"]["finish_reason"]
    if isinstance(main, Exception):
        if reason.get("type") == "pdd_handoff":
            raise GenerateError(f"main: {main}")
        main = {"error": str(main)}  # the relay finished the request; MD's copy was let go
    if reason.get("type") == "pdd_handoff":
        k = int(reason["handoff_tokens"])
        tokens = relay["output_ids"][:k] + main["output_ids"][k:]
    else:  # the relay finished the request itself
        k = len(relay["output_ids"])
        tokens = relay["output_ids"]
    return RelayedResult(relay=relay, main=main, k=k, tokens=tokens,
                         timings={n: results[n + "_s"] for n, *_ in calls})
