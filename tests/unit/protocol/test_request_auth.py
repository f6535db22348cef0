"""The router's signature on a request's PDD parameters (protocol/request_auth.py)."""

import hashlib
import hmac
import json

import msgspec
import pytest

from sglang_pdd.protocol.request import RequestParams, RequestParamsError, parse
from sglang_pdd.protocol.request_auth import ParamsSigner, ParamsVerifier

from tests.fakes.clock import FakeClock

SECRET = b"shared"
P = RequestParams(v=1, main_room=99)
MD = RequestParams(v=1, relay_room=5, relay="tcp://rld:1", handoff="catch-up", chunk=8)


def test_signed_parameters_verify_once_for_their_room_and_survive_the_wire():
    s, v = ParamsSigner(SECRET), ParamsVerifier(SECRET)
    for params, room in ((P, 7), (MD, 8)):
        signed = s.sign(params, room)
        wire = parse(msgspec.json.decode(msgspec.json.encode(signed.to_custom_params())))
        assert wire == signed and wire.sig and wire.exp
        v.check(wire, room)


@pytest.mark.parametrize("field, value", [("main_room", 98), ("relay_room", 6), ("relay", "tcp://evil:1"),
                                          ("handoff", "one-shot"), ("chunk", 9), ("exp", 1 << 40)])
def test_any_altered_field_breaks_the_signature(field, value):
    base = MD if field != "main_room" else P
    signed = ParamsSigner(SECRET).sign(base, 7)
    with pytest.raises(RequestParamsError, match="does not match"):
        ParamsVerifier(SECRET).check(msgspec.structs.replace(signed, **{field: value}), 7)
    ParamsVerifier(SECRET).check(signed, 7)  # the control: unaltered, it verifies


def test_unsigned_wrong_room_wrong_secret_and_expired_are_refused():
    clock = FakeClock(1_000_000.0)
    signed = ParamsSigner(SECRET, ttl_s=300, clock=clock).sign(P, 7)
    with pytest.raises(RequestParamsError, match="not signed"):
        ParamsVerifier(SECRET).check(P, 7)
    with pytest.raises(RequestParamsError, match="does not match"):
        ParamsVerifier(SECRET, clock=clock).check(signed, 8)
    with pytest.raises(RequestParamsError, match="does not match"):
        ParamsVerifier(b"another", clock=clock).check(signed, 7)
    clock.t += 301
    with pytest.raises(RequestParamsError, match="expired"):
        ParamsVerifier(SECRET, clock=clock).check(signed, 7)
    clock.t -= 2
    ParamsVerifier(SECRET, clock=clock).check(signed, 7)  # within its life it verifies


def test_a_replay_is_refused_until_its_signature_expires_and_the_memory_is_bounded():
    clock = FakeClock(1_000_000.0)
    s, v = ParamsSigner(SECRET, ttl_s=10, clock=clock), ParamsVerifier(SECRET, clock=clock, cap=3)
    first = s.sign(P, 7)
    v.check(first, 7)
    with pytest.raises(RequestParamsError, match="already used"):
        v.check(first, 7)
    clock.t += 5
    later = [s.sign(RequestParams(v=1, main_room=r), 7) for r in (1, 2, 3)]
    for x in later:
        v.check(x, 7)
    assert len(v._seen) == 3  # capped: the oldest went first
    clock.t += 6  # first's life is over; the later ones live on
    v.check(s.sign(RequestParams(v=1, main_room=4), 7), 7)
    with pytest.raises(RequestParamsError, match="already used"):
        v.check(later[2], 7)


def test_the_key_is_not_the_token_channels():
    """The same secret MACs token-channel frames; a parameters MAC is made with a derived key."""
    signed = ParamsSigner(SECRET).sign(P, 7)
    raw = msgspec.json.Encoder(order="sorted").encode({"v": 1, "main_room": 99, "exp": signed.exp}) + b"|room=7"
    assert signed.sig != hmac.new(SECRET, raw, hashlib.sha256).hexdigest()[:32]


def test_a_malformed_signature_is_a_clear_error():
    with pytest.raises(RequestParamsError, match="sig"):
        parse({"pdd": {"v": 1, "main_room": 9, "sig": "ab"}})
    with pytest.raises(RequestParamsError, match="sig"):
        parse({"pdd": {"v": 1, "main_room": 9, "exp": 1, "sig": "x" * 65}})


@pytest.mark.parametrize("sig", ["é" * 32, "\ud800" + "a" * 31, "ａ" * 32])
def test_a_signature_that_is_not_ascii_is_a_mismatch_not_a_crash(sig):
    """A non-ASCII `sig` from anyone who reaches P directly made compare_digest raise TypeError, which
    only RequestParamsError handlers around it do not catch (issue 31)."""
    clock = FakeClock(1_000_000.0)
    signed = ParamsSigner(SECRET, clock=clock).sign(P, 7)
    forged = msgspec.structs.replace(signed, sig=sig)
    with pytest.raises(RequestParamsError, match="does not match"):
        ParamsVerifier(SECRET, clock=clock).check(forged, 7)
    # through the wire form P parses, too
    wire = json.loads(json.dumps({"pdd": msgspec.to_builtins(forged)}))  # "\ud800" escapes as sglang reads them
    with pytest.raises(RequestParamsError):
        ParamsVerifier(SECRET, clock=clock).check(parse(wire), 7)
