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

    @property
    def handed_over(self) -> bool:
        return self.relay["meta_info"]["finish_reason"].get("type") == "pdd_handoff"


def held_on_main(url: str) -> float:
    """MD's gauge of requests whose KV landed and that wait for RLD's tokens."""
    from sglang_pdd.metrics import parse_exposition
    from sglang_pdd.testing.servers import http_json

    status, text = http_json(url + "/metrics")
    return sum(parse_exposition(text, "sglang_pdd_handoff_held_requests").values()) if status == 200 else 0.0


def relayed_generate(roles: Roles, body: dict, **kw) -> RelayedResult:
    """One request through P -> RLD -> MD (see `relayed_generate_many`)."""
    return relayed_generate_many(roles, [body], **kw)[0]


def relayed_generate_many(roles: Roles, bodies: list[dict], *, fanout: bool = False, main_first: bool = False,
                          main_extra: dict | None = None, wait_s: float = 120.0) -> list[RelayedResult]:
    """Requests through P -> RLD -> MD at once. `main_first` (not with `fanout`): MD's legs go first and
    RLD's only once MD holds them all (KV landed, Ready sent), so RLD answers each at its first chance:
    k = 1, or exactly the relay's `relay_min_eager` test knob. Otherwise every leg goes at once."""
    assert not (fanout and main_first), "the fan-out needs RLD's leg to bootstrap MD's"
    results: dict[tuple[int, str], object] = {}
    main_calls, relay_calls = [], []
    for i, body in enumerate(bodies):
        room, room2 = random.getrandbits(63), random.getrandbits(63)
        boot = {"bootstrap_host": roles.bootstrap_host, "bootstrap_port": roles.bootstrap_port}
        to_relay = {**body, **boot, "bootstrap_room": room}
        to_main = with_params({**body, **boot, "bootstrap_room": room2},
                              RequestParams(v=1, relay_room=room, relay=roles.token_channel, **(main_extra or {})))
        main_calls.append((i, "main", roles.main, to_main))
        if fanout:
            relay_calls.append((i, "prefill", roles.prefill, with_params(to_relay, RequestParams(v=1, main_room=room2))))
        else:
            relay_calls.append((i, "prefill", roles.prefill, to_relay))
            main_calls.append((i, "prefill_main", roles.prefill, to_main))
        relay_calls.append((i, "relay", roles.relay, to_relay))
    t0 = time.monotonic()

    def call(i, name, url, b):
        try:
            results[i, name] = generate(url, b)
        except Exception as e:
            results[i, name] = e
        results[i, name + "_s"] = time.monotonic() - t0

    def start(calls):
        ts = [threading.Thread(target=call, args=c) for c in calls]
        for t in ts:
            t.start()
        return ts

    if main_first:
        held = held_on_main(roles.main)
        threads = start(main_calls)
        deadline = time.monotonic() + wait_s
        while held_on_main(roles.main) < held + len(bodies):
            if any((i, "main") in results for i in range(len(bodies))):
                raise GenerateError(f"main answered before the relay was asked: {results}")
            if time.monotonic() > deadline:
                raise GenerateError(f"main never held the requests within {wait_s:g} s")
            time.sleep(0.05)
        threads += start(relay_calls)
    else:
        threads = start(main_calls + relay_calls)
    for t in threads:
        t.join()
    return [_stitch(results, i, main_calls + relay_calls) for i in range(len(bodies))]


def _stitch(results: dict, i: int, calls: list) -> RelayedResult:
    if isinstance(results[i, "relay"], Exception):
        raise GenerateError(f"relay: {results[i, 'relay']}")
    relay, main = results[i, "relay"], results[i, "main"]
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
                         timings={n: results[i, n + "_s"] for j, n, *_ in calls if j == i})

