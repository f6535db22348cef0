"""What one request tells each role, carried in `sampling_params.custom_params["pdd"]`.

sglang passes `custom_params` through to the scheduler's `Req` unchanged (JSON-safe scalars, one
level of dict). The router (or a client doing its job) sets, for a relayed request whose RLD key is
room R and whose MD key is room R2:

* to P (bootstrap_room=R):   {"v": 1, "main_room": R2}              -> fan out: RLD gets all, MD its miss
* to RLD (bootstrap_room=R): {"v": 1}                              -> decode at once, hand over on READY
* to MD (bootstrap_room=R2): {"v": 1, "relay_room": R, "relay": "tcp://host:port"}  -> take over by EXTEND

and for a request relayed on P itself (a P started with `--pdd-relay local`; one room R, no RLD):

* to P (bootstrap_room=R):   {"v": 1, "relay_here": true}          -> send MD its miss, decode until MD takes over
* to MD (bootstrap_room=R):  {"v": 1, "relay_room": R, "relay": P's token channel}

P's and MD's parameters carry the router's signature (`exp`, `sig`: see `protocol.request_auth`).

A request without the key is an ordinary PD request on every role.
"""

from __future__ import annotations

import msgspec

from sglang_pdd.protocol import PROTOCOL_VERSION
from sglang_pdd.protocol.messages import HANDOFF_MODES, MAX_CHUNK

KEY = "pdd"
MAX_ROOM = 2**63 - 1


class RequestParamsError(ValueError):
    pass


class RequestParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    main_room: int | None = None  # P: MD's own bootstrap room (the fan-out target)
    relay_here: bool | None = None  # P (--pdd-relay local): decode this request until MD takes over
    relay_room: int | None = None  # MD: the room that keys this request on RLD
    relay: str | None = None  # MD: RLD's token channel, "tcp://host:port"
    handoff: str | None = None  # MD: one-shot | catch-up | adaptive (overrides --pdd-handoff-mode)
    chunk: int | None = None  # MD: catch-up chunk size in tokens (overrides --pdd-catchup-chunk)
    exp: int | None = None  # unix seconds after which the signature is void (protocol.request_auth)
    sig: str | None = None  # the router's signature over the rest and the body's bootstrap room

    def to_custom_params(self) -> dict:
        return {KEY: {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}}


def parse(custom_params: dict | None) -> RequestParams | None:
    """The request's PDD parameters, None for a plain request; a clear error when malformed."""
    if not custom_params or KEY not in custom_params:
        return None
    raw = custom_params[KEY]
    try:
        p = msgspec.convert(raw, RequestParams)
    except msgspec.ValidationError as e:
        raise RequestParamsError(f"custom_params.{KEY}: {e}") from None
    if p.v != PROTOCOL_VERSION:
        raise RequestParamsError(f"custom_params.{KEY}: unsupported protocol version {p.v} (this is {PROTOCOL_VERSION})")
    for name in ("main_room", "relay_room"):
        room = getattr(p, name)
        if room is not None and not 0 <= room <= MAX_ROOM:
            raise RequestParamsError(f"custom_params.{KEY}.{name}: {room} is not a bootstrap room (0..2^63-1)")
    if (p.relay_room is None) != (p.relay is None):
        raise RequestParamsError(f"custom_params.{KEY}: relay_room and relay go together")
    if p.handoff is not None and p.handoff not in HANDOFF_MODES:
        raise RequestParamsError(f"custom_params.{KEY}.handoff: {p.handoff!r} is not one of {', '.join(HANDOFF_MODES)}")
    if p.chunk is not None and not 1 <= p.chunk <= MAX_CHUNK:
        raise RequestParamsError(f"custom_params.{KEY}.chunk: {p.chunk} is not in 1..{MAX_CHUNK}")
    if p.sig is not None and (len(p.sig) > 64 or p.exp is None):
        raise RequestParamsError(f"custom_params.{KEY}.sig: malformed (a signature goes with its exp)")
    if p.relay_here is not None and p.main_room is not None:
        raise RequestParamsError(f"custom_params.{KEY}: relay_here and main_room exclude each other (a P that "
                                 "relays sends MD its miss over the request's own room)")
    if p.relay is not None and not p.relay.startswith("tcp://"):
        raise RequestParamsError(f"custom_params.{KEY}.relay: expected tcp://host:port, got {p.relay!r}")
    return p


def with_params(body: dict, params: RequestParams) -> dict:
    """A copy of a `/generate` body whose `sampling_params.custom_params` carry `params`."""
    sp = dict(body.get("sampling_params") or {})
    sp["custom_params"] = {**(sp.get("custom_params") or {}), **params.to_custom_params()}
    return {**body, "sampling_params": sp}


def without_internal(sampling_params: dict) -> dict:
    """A copy without the PDD parameters a client may have set (the router sets its own)."""
    sp = dict(sampling_params)
    custom = sp.get("custom_params")
    if isinstance(custom, dict) and KEY in custom:
        custom = {k: v for k, v in custom.items() if k != KEY}
        if custom:
            sp["custom_params"] = custom
        else:
            del sp["custom_params"]
    return sp
