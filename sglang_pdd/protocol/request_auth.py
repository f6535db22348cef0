"""The router's signature on a request's PDD parameters (`custom_params.pdd`).

P acts on `main_room` (it fans the KV out to that room) and MD on `relay`/`relay_room` (it holds the
request until that relay hands over). Only the router may ask for either: it signs the parameters,
bound to the body's bootstrap room and an expiry, with a key derived from the shared secret
(`SGLANG_PDD_SECRET`, the token channel's; the derivation keeps the two MACs apart). A server with
the secret refuses unsigned, tampered, expired, re-bound and replayed parameters with a 400.

    sig = HMAC-SHA256(HMAC-SHA256(secret, DOMAIN), canonical(params without sig) || room)[:16], hex
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from typing import Callable

import msgspec

from sglang_pdd.protocol.request import KEY, RequestParams, RequestParamsError

DOMAIN = b"sglang-pdd/request-params/v1"
TTL_S = 300  # a signature's life: admission happens at once, the rest is clock skew between sites
SIG_HEX = 32
REPLAY_CAP = 1 << 20  # signatures remembered until their expiry (oldest dropped beyond this)

_encode = msgspec.json.Encoder(order="sorted").encode


def _key(secret: bytes) -> bytes:
    if not secret:
        raise ValueError("empty secret")
    return hmac.new(secret, DOMAIN, hashlib.sha256).digest()


def _mac(key: bytes, params: RequestParams, room: int | None) -> str:
    fields = {k: v for k, v in msgspec.structs.asdict(params).items() if v is not None and k != "sig"}
    msg = _encode(fields) + b"|room=" + str(room).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:SIG_HEX]


class ParamsSigner:
    """The router's side: the parameters with their expiry and signature for the body of `room`."""

    def __init__(self, secret: bytes, ttl_s: int = TTL_S, clock: Callable[[], float] = time.time):
        self._key, self._ttl, self._clock = _key(secret), ttl_s, clock

    def sign(self, params: RequestParams, room: int) -> RequestParams:
        unsigned = msgspec.structs.replace(params, exp=int(self._clock()) + self._ttl, sig=None)
        return msgspec.structs.replace(unsigned, sig=_mac(self._key, unsigned, room))


class ParamsVerifier:
    """A server's side: `check` raises RequestParamsError (a 400) unless the router signed these
    parameters for this room, they have not expired and this server has not seen them before."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time, cap: int = REPLAY_CAP):
        self._key, self._clock, self._cap = _key(secret), clock, cap
        self._seen: OrderedDict[str, int] = OrderedDict()  # sig -> exp, in the order they came

    def check(self, params: RequestParams, room: int | None) -> None:
        if params.sig is None or params.exp is None:
            raise RequestParamsError(f"custom_params.{KEY}: not signed by the router (this server takes PDD "
                                     "parameters only from a router holding SGLANG_PDD_SECRET)")
        # compare_digest raises TypeError on a str that is not ASCII: such a sig is only a mismatch
        if not (params.sig.isascii() and hmac.compare_digest(params.sig, _mac(self._key, params, room))):
            raise RequestParamsError(f"custom_params.{KEY}: signature does not match (wrong secret, "
                                     "altered parameters or another request's bootstrap room)")
        now = int(self._clock())
        if params.exp < now:
            raise RequestParamsError(f"custom_params.{KEY}: signature expired {now - params.exp} s ago")
        self._prune(now)
        if params.sig in self._seen:
            raise RequestParamsError(f"custom_params.{KEY}: these signed parameters were already used")
        self._seen[params.sig] = params.exp
        if len(self._seen) > self._cap:
            self._seen.popitem(last=False)

    def _prune(self, now: int) -> None:
        # oldest first: signatures arrive in about the order of their expiry; bounded work per call
        for _ in range(4096):
            if not self._seen:
                return
            sig, exp = next(iter(self._seen.items()))
            if exp >= now:
                return
            del self._seen[sig]

def verifier_or_none(secret: bytes | None) -> ParamsVerifier | None:
    return ParamsVerifier(secret) if secret else None
