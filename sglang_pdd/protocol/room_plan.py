"""The room plan of one request: its bootstrap rooms and the `/generate` body each role is sent.

P's bootstrap server keys a KV transfer by room. Every body is the input body plus P's bootstrap
host and port and its room; per pipeline:

* P->MD:      P and MD room R; no PDD parameters.
* P->RLD->MD: P and RLD room R, MD room R2. P's body carries `main_room=R2` (its fan-out sender
  feeds MD too); MD's carries `relay_room=R` and RLD's token channel (see `protocol.request`).
* P->RLD:     P and RLD room R (odd traffic: RLD finishes the request); MD is not asked.
* P->RLD->MD relayed on P itself (`relay_here`: a P started with `--pdd-relay local` is the relay): P and MD
  room R, no RLD. P's body (the "relay" copy: its stream is the relay's) carries `relay_here`; MD's
  carries `relay_room=R` and P's token channel.

The router (`router/request/dispatch.py`) plans every request this way, and signs P's and MD's parameters
(`protocol.request_auth`); so do the clients that drive the roles by hand (`testing/pdd_client.py`,
the fan-out and packed-WAN e2e tests), with the secret the servers hold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.protocol import PROTOCOL_VERSION
from sglang_pdd.protocol.request import RequestParams, with_params
from sglang_pdd.protocol.request_auth import ParamsSigner

RID_SUFFIX = {"prefill": "-p", "relay": "-r", "main": "-m"}


@dataclass(frozen=True)
class RoomPlan:
    pipeline: Pipeline
    room: int  # R: P's and RLD's room (MD's too on P->MD)
    main_room: int  # R2: MD's room on P->RLD->MD (drawn, unused, otherwise)
    bodies: dict[str, dict]  # role (prefill, relay, main) -> its body, in the order to send them


def new_rooms() -> tuple[int, int]:
    """Two random bootstrap rooms (R, R2) in 0..2^63-1."""
    return random.getrandbits(63), random.getrandbits(63)


def plan(body: dict, pipeline: Pipeline, bootstrap_host: str, bootstrap_port: int,
         token_channel: str | None = None, *, rooms: tuple[int, int] | None = None,
         rid: str | None = None, main_params: dict | None = None, signer: ParamsSigner | None = None,
         relay_here: bool = False) -> RoomPlan:
    """The rooms and per-role bodies of `body` through `pipeline`. `rooms` (R, R2) default to
    `new_rooms()`; with `rid`, each body gets `rid` plus its role's suffix (-p, -r, -m).
    `token_channel` is RLD's (tcp://host:port); without it on P->RLD->MD, MD only receives its KV
    from P's fan-out and is not told of a relay (the fan-out tests). `main_params` adds fields of
    MD's `RequestParams` (handoff, chunk, ...). `signer` (the router's) signs P's and MD's parameters,
    each bound to its body's room; without it they go unsigned (a server holding the secret refuses them).
    `relay_here` (P->RLD->MD only): the relay is P itself, `token_channel` P's."""
    if main_params and token_channel is None:
        raise ValueError("main_params go with a relay's token channel")
    room, room2 = rooms if rooms is not None else new_rooms()
    base = {**body, "bootstrap_host": bootstrap_host, "bootstrap_port": bootstrap_port}

    def signed(params: RequestParams, r: int) -> RequestParams:
        return signer.sign(params, r) if signer is not None else params

    def to(role: str, r: int) -> dict:
        out = {**base, "bootstrap_room": r}
        if rid is not None:
            out["rid"] = rid + RID_SUFFIX[role]
        return out

    bodies: dict[str, dict] = {}
    if relay_here and pipeline is not Pipeline.P_RLD_MD:
        raise ValueError(f"only P->RLD->MD relays on P, not {pipeline.value}")
    if pipeline is Pipeline.P_MD:
        bodies["prefill"], bodies["main"] = to("prefill", room), to("main", room)
    elif pipeline is Pipeline.P_RLD_MD and relay_here:
        if token_channel is None:
            raise ValueError("a relay on P needs P's token channel")
        bodies["main"] = with_params(to("main", room), signed(RequestParams(
            v=PROTOCOL_VERSION, relay_room=room, relay=token_channel, **(main_params or {})), room))
        bodies["relay"] = with_params(to("relay", room), signed(RequestParams(v=PROTOCOL_VERSION, relay_here=True), room))
        room2 = room
    elif pipeline is Pipeline.P_RLD_MD:
        main = to("main", room2)
        if token_channel is not None:
            main = with_params(main, signed(RequestParams(v=PROTOCOL_VERSION, relay_room=room, relay=token_channel,
                                                          **(main_params or {})), room2))
        bodies["main"] = main
        bodies["prefill"] = with_params(to("prefill", room),
                                        signed(RequestParams(v=PROTOCOL_VERSION, main_room=room2), room))
        bodies["relay"] = to("relay", room)
    elif pipeline is Pipeline.P_RLD:
        bodies["prefill"], bodies["relay"] = to("prefill", room), to("relay", room)
    else:
        raise ValueError(f"no room plan for pipeline {pipeline!r}")
    return RoomPlan(pipeline, room, room2, bodies)
