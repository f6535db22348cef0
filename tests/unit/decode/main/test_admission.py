"""MainDecode takes a relayed request only from a relay named at start-up, and whatever goes wrong
while taking one ends that request with an error (sglang's FINISH_ABORT), never the scheduler.

A real MainRuntime with a real token channel (ZMQ), over a minimal scheduler and request."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.extension import DecodeExtension
from sglang_pdd.decode.role import DecodeRole
from sglang_pdd.hooks import decode as decode_hooks
from sglang_pdd.decode.main.runtime import MainRuntime
from sglang_pdd.protocol.request import RequestParams
from sglang_pdd.protocol.request_auth import ParamsSigner
from sglang_pdd.server.roles import Role

pytest.importorskip("sglang")

TRUSTED = "tcp://127.0.0.1:18599"
# zmq refuses to connect there (no port): start-up validation keeps it out of --pdd-relays, the config
# here does not, so that the path where connecting raises is exercised
UNCONNECTABLE = "tcp://rld-nowhere"
SECRET = b"s"
MD_ROOM = 77


@dataclass
class Req:
    rid: str
    custom_params: dict | None = None
    to_finish: object = None
    finished_reason: object = None
    return_logprob: bool = False
    sampling_params: object = None
    logprob: object = field(default_factory=SimpleNamespace)
    bootstrap_room: int = MD_ROOM

    def __post_init__(self):
        self.sampling_params = SimpleNamespace(custom_params=self.custom_params)

    def finished(self):
        return self.finished_reason is not None

    def error(self) -> dict | None:
        return None if self.finished_reason is None else self.finished_reason.to_json()


def relayed(rid: str, relay: str, room: int = 7, signer=ParamsSigner(SECRET), md_room: int = MD_ROOM,
            signed_for: int | None = None) -> Req:
    """MD's copy of a relayed request as the router sends it (signed for MD's room)."""
    params = RequestParams(v=1, relay_room=room, relay=relay)
    signed = signer.sign(params, md_room if signed_for is None else signed_for) if signer else params
    return Req(rid, signed.to_custom_params(), bootstrap_room=md_room)


def build(cls=MainRuntime, **kw):
    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=1000), waiting_queue=[])
    rt = cls(scheduler, PddConfig(role=Role.MAIN, relays=f"{TRUSTED},{UNCONNECTABLE}"), secret=SECRET, **kw)
    scheduler._pdd_runtime = rt
    return rt


@pytest.fixture
def main(monkeypatch):
    rt = build()
    yield rt
    rt.channel.close()


def test_a_relay_not_named_at_start_up_ends_that_request_with_a_400(main):
    req = relayed("a", "tcp://nohost:1")
    main.admit(req)
    err = req.error()
    assert err["type"] == "abort" and err["status_code"] == 400
    assert "tcp://nohost:1" in err["message"] and "--pdd-relays" in err["message"]
    assert not main.handoff.pending and not main.channel.sockets()  # nothing connected, nothing kept


def test_a_trusted_relay_is_admitted_and_watched(main):
    req = relayed("b", TRUSTED)
    main.admit(req)
    assert req.error() is None and main.handoff.is_relayed(req)
    assert len(main.channel.sockets()) == 2  # one relay: its DEALER and the monitor of its handshakes


def test_a_trusted_relay_that_cannot_be_connected_ends_that_request(main):
    # zmq.ZMQError on connect used to escape into sglang's process_input_requests
    req = relayed("c", UNCONNECTABLE)
    main.admit(req)
    err = req.error()
    assert err["type"] == "abort" and "cannot reach the relay" in err["message"]
    assert not main.handoff.is_relayed(req) and not main.handoff.pending
    ok = relayed("d", TRUSTED, room=8)
    main.admit(ok)
    assert ok.error() is None and main.handoff.is_relayed(ok)


def test_a_second_request_for_a_relay_room_in_hand_is_refused(main):
    first, second = relayed("e", TRUSTED, room=9), relayed("f", TRUSTED, room=9, md_room=MD_ROOM + 2)
    main.admit(first)
    main.admit(second)
    assert first.error() is None and main.handoff.is_relayed(first)
    assert "already being handed over" in second.error()["message"]


@pytest.mark.parametrize("req, words", [
    (relayed("u", TRUSTED, signer=None), "not signed"),  # what a client reaching MD could send
    (relayed("w", TRUSTED, signer=ParamsSigner(b"other")), "does not match"),
    (relayed("x", TRUSTED, signed_for=MD_ROOM + 1), "does not match"),  # signed for another request's room
    (relayed("y", TRUSTED, signer=ParamsSigner(SECRET, ttl_s=-10)), "expired"),
])
def test_only_the_routers_signed_parameters_for_this_room_are_taken(main, req, words):
    main.admit(req)
    err = req.error()
    assert err is not None and err["status_code"] == 400 and words in err["message"], err
    assert not main.handoff.pending and not main.channel.sockets()


def test_signed_parameters_replayed_are_refused(main):
    first = relayed("r1", TRUSTED, room=11)
    again = Req("r2", first.custom_params, bootstrap_room=first.bootstrap_room)
    main.admit(first)
    main.admit(again)
    assert first.error() is None and main.handoff.is_relayed(first)  # the control: the first is taken
    assert again.error()["status_code"] == 400 and "already used" in again.error()["message"]


def test_malformed_parameters_end_that_request_with_a_400(main):
    req = Req("g", {"pdd": {"v": 1, "relay": "udp://x", "relay_room": 1}})
    main.admit(req)
    assert req.error()["status_code"] == 400 and "relay" in req.error()["message"]


class Exploding(DecodeRole):
    def admit(self, req):
        raise RuntimeError("boom")


@pytest.mark.parametrize("entry", ["hook", "extension"])
def test_any_exception_while_taking_a_request_ends_that_request_not_the_scheduler(entry):
    scheduler = SimpleNamespace(_pdd_runtime=Exploding(None))
    req = Req("h")
    if entry == "hook":  # stock sglang
        decode_hooks.after_add_request_to_queue(None, scheduler, req)
    else:  # sglang's decode scheduler extension (patch 0003)
        DecodeExtension(scheduler._pdd_runtime).on_request_queued(req)
    err = req.error()
    assert err["type"] == "abort" and "RuntimeError: boom" in err["message"]


def test_the_drop_eager_kv_knob_marks_the_admitted_request(main, tmp_path):
    """The negative control is MD's own switch (test knobs + SGLANG_PDD_TESTING, on the controlled
    runtime), not a request field; the plain runtime never marks one."""
    from sglang_pdd.decode.main.controls import ControlledMainRuntime
    from sglang_pdd.test_switches import TestSwitches

    knobs = tmp_path / "knobs.json"
    controlled = build(ControlledMainRuntime, switches=TestSwitches(knobs_file=str(knobs), testing=True))
    try:
        controlled.admit(relayed("i", TRUSTED, room=8))  # no knobs file yet: off
        knobs.write_text('{"drop_eager_kv": true}')
        controlled.admit(relayed("j", TRUSTED, room=9))
        main.admit(relayed("k", TRUSTED, room=10))
        assert [p.drop_eager_kv for p in controlled.handoff.pending.values()] == [False, True]
        assert [p.drop_eager_kv for p in main.handoff.pending.values()] == [False]
    finally:
        controlled.channel.close()
