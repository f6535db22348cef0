"""Driving P, RLD and MD by hand, as the PDD router does (and as tests and benchmarks do without it).

One relayed request, planned as the router plans it (`protocol.room_plan`): P gets the prompt for
room R and, in the same body, `custom_params.pdd.main_room = R2` so its fan-out sender also feeds MD
(room R2). `fanout=False` sends P RLD's body (room R, no `main_room`) and a second request, MD's body
for room R2, instead (P's radix cache makes it cheap). RLD gets room R; MD gets room R2 with
`relay_room = R` and RLD's token-channel address. P's and MD's parameters are signed with the
secret the servers hold (`SGLANG_PDD_SECRET`), as the router signs them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.protocol import room_plan
from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.protocol import keys
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.lab.testing.client import GenerateError, generate
from sglang_pdd.lab.testing.servers import http_json


def signer_from_env(environ: dict | None = None) -> ParamsSigner | None:
    """A signer with the shared secret as the servers read it (`protocol.keys.optional_secret`:
    `SGLANG_PDD_SECRET` or the file `SGLANG_PDD_SECRET_FILE` names), None without one; ValueError
    when both are set or the file cannot be read or is empty."""
    secret = keys.optional_secret(environ)
    return ParamsSigner(secret) if secret else None


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
        return HandoffFinish.from_finish(self.relay["meta_info"]["finish_reason"]) is not None


def held_on_main(url: str) -> float:
    """MD's gauge of requests whose KV landed and that wait for RLD's tokens."""
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
        plan = room_plan.plan(body, Pipeline.P_RLD_MD, roles.bootstrap_host, roles.bootstrap_port,
                              roles.token_channel, main_params=main_extra, signer=signer_from_env())
        to_relay, to_main = plan.bodies["relay"], plan.bodies["main"]
        main_calls.append((i, "main", roles.main, to_main))
        if fanout:
            relay_calls.append((i, "prefill", roles.prefill, plan.bodies["prefill"]))
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
    handoff = HandoffFinish.from_finish(relay["meta_info"]["finish_reason"])
    if isinstance(main, Exception):
        if handoff is not None:
            raise GenerateError(f"main: {main}")
        main = {"error": str(main)}  # the relay finished the request; MD's copy was let go
    if handoff is not None:
        k = handoff.handoff_tokens
        tokens = relay["output_ids"][:k] + main["output_ids"][k:]
    else:  # the relay finished the request itself
        k = len(relay["output_ids"])
        tokens = relay["output_ids"]
    return RelayedResult(relay=relay, main=main, k=k, tokens=tokens,
                         timings={n: results[i, n + "_s"] for j, n, *_ in calls if j == i})



def local_relayed_generate(prefill: str, main: str, bootstrap_host: str, bootstrap_port: int, token_channel: str,
                           body: dict, *, room: int | None = None, stream: bool = False, stop_after: int | None = None,
                           seen: list | None = None) -> RelayedResult:
    """One request relayed on P itself (a P started with `--pdd-relay local`): P and MD share room R; P's
    body says `relay_here`, MD's names P's token channel as its relay (`protocol.request`), both signed as
    the router signs them. P's reply plays RLD's part in the result. `stream`: P's reply is read as a
    stream (its chunks appended to `seen`); with `stop_after` the client leaves after that many chunks
    carrying tokens (then GenerateError, once MD's copy ended)."""
    from sglang_pdd.protocol import PROTOCOL_VERSION
    from sglang_pdd.protocol.request import RequestParams, with_params

    room = room if room is not None else room_plan.new_rooms()[0]
    signer = signer_from_env()
    base = {**body, "bootstrap_host": bootstrap_host, "bootstrap_port": bootstrap_port, "bootstrap_room": room}

    def signed(params: RequestParams) -> RequestParams:
        return signer.sign(params, room) if signer is not None else params

    to_p = with_params(base, signed(RequestParams(v=PROTOCOL_VERSION, relay_here=True)))
    to_main = with_params(base, signed(RequestParams(v=PROTOCOL_VERSION, relay_room=room, relay=token_channel)))
    results: dict = {}
    t0 = time.monotonic()

    def call(name, url, b):
        try:
            results[0, name] = _streamed(url, b, stop_after, seen) if stream and name == "relay" else generate(url, b)
        except Exception as e:
            results[0, name] = e
        results[0, name + "_s"] = time.monotonic() - t0

    threads = [threading.Thread(target=call, args=a) for a in (("main", main, to_main), ("relay", prefill, to_p))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if stop_after is not None:
        raise GenerateError(f"the client left after {stop_after} chunks")
    return _stitch(results, 0, [(0, "main"), (0, "relay")])


def _streamed(url: str, body: dict, stop_after: int | None, seen: list | None) -> dict:
    """A streamed /generate read to its end (or left after `stop_after` chunks with tokens): the last chunk,
    its logprobs those of every chunk where sglang sent each chunk's own."""
    from sglang_pdd.lab.testing.client import sse_chunks

    chunks = seen if seen is not None else []
    gen = sse_chunks(url, body)
    try:
        for chunk in gen:
            if "error" in chunk:
                raise GenerateError(f"{url}: {chunk['error']}")
            chunks.append(chunk)
            if stop_after is not None and sum(1 for c in chunks if c.get("output_ids")) >= stop_after:
                return chunk
    finally:
        gen.close()
    last = chunks[-1]
    lps = last["meta_info"].get("output_token_logprobs")
    if lps is not None and len(lps) < len(last["output_ids"]):
        last["meta_info"]["output_token_logprobs"] = [lp for c in chunks for lp in c["meta_info"]["output_token_logprobs"]]
    return last
