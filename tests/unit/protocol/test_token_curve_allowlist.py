"""The relay's CURVE allowlist over real ZMQ: an MD whose public key is on it connects and exchanges
frames both ways; an MD with another key (or a keypair drawn per connection) fails the handshake and
nothing it sends arrives, while an allowed MD keeps being served; the control: the same unknown key
gets through a relay that admits any key. The start-up rules: a relay with CURVE and no allowlist
refuses to start, naming the variable; `*` is the explicit opt-out."""

import pytest
import zmq

from sglang_pdd.config import PddConfigError
from sglang_pdd.protocol import curve, keys
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.keys import ChannelKeyError
from sglang_pdd.protocol.messages import Ready, Tokens

from .test_token_channel import wait_for

SECRET = b"k"


@pytest.fixture
def pairs():
    relay_public, relay_secret = zmq.curve_keypair()
    allowed_public, allowed_secret = zmq.curve_keypair()
    _, other_secret = zmq.curve_keypair()
    return dict(relay_public=relay_public, relay_secret=relay_secret, allowed_public=allowed_public,
                allowed_secret=allowed_secret, other_secret=other_secret)


def relay(pairs, clients):
    return RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=2048, curve_key=pairs["relay_secret"],
                        curve_clients=clients)


def exchange(rld: RelayChannel, md: MainChannel, room: int) -> list:
    """Ready from MD, Tokens back: what MD got (empty when nothing passed)."""
    md.send(rld.address, Ready(room=room, have=0, mode="one-shot"))
    got = wait_for(rld.poll, timeout=5.0)
    if not got:
        return []
    (peer, msg), = got
    assert msg.room == room
    rld.send(peer, Tokens(room=room, start=0, ids=[1, 2, 3], final=True))
    return wait_for(md.poll, timeout=5.0)


def handshake_refused(md: MainChannel, rld: RelayChannel) -> bool:
    """MD's socket reports the relay refused its handshake (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, on the
    monitor MD keeps on each DEALER)."""
    md.send(rld.address, Ready(room=9, have=0, mode="one-shot"))
    conn = md._conns[rld.address]
    return bool(wait_for(lambda: md.poll() or conn.refusals, timeout=10.0)) and conn.refusals >= 1


def test_an_allowed_main_key_connects_and_exchanges_frames(pairs):
    rld = relay(pairs, frozenset({pairs["allowed_public"]}))
    md = MainChannel(SECRET, vocab_size=2048, curve_key=pairs["relay_public"], curve_client_key=pairs["allowed_secret"])
    try:
        assert [m.ids for _, m in exchange(rld, md, room=1)] == [[1, 2, 3]]
        assert rld.rejected["curve_unknown_key"] == 0
    finally:
        md.close(), rld.close()


@pytest.mark.parametrize("client", ["other key", "drawn per connection"])
def test_an_unknown_main_key_gets_nothing_through(pairs, client):
    rld = relay(pairs, frozenset({pairs["allowed_public"]}))
    intruder = MainChannel(SECRET, vocab_size=2048, curve_key=pairs["relay_public"],
                           curve_client_key=pairs["other_secret"] if client == "other key" else None)
    md = MainChannel(SECRET, vocab_size=2048, curve_key=pairs["relay_public"], curve_client_key=pairs["allowed_secret"])
    try:
        assert handshake_refused(intruder, rld)
        for _ in range(20):
            intruder.send(rld.address, Ready(room=2, have=0, mode="one-shot"))
        assert [m.room for _, m in exchange(rld, md, room=3)] == [3]  # the allowed MD's frame, none of its
        assert wait_for(lambda: rld.poll() or rld.rejected["curve_unknown_key"] >= 1)  # counted on poll
        assert rld.rejected["curve_unknown_key"] >= 1 and rld.poll() == [] and intruder.poll() == []
    finally:
        intruder.close(), md.close(), rld.close()


def test_control_the_same_unknown_key_passes_a_relay_that_admits_any(pairs):
    rld = relay(pairs, None)
    intruder = MainChannel(SECRET, vocab_size=2048, curve_key=pairs["relay_public"], curve_client_key=pairs["other_secret"])
    try:
        assert [m.ids for _, m in exchange(rld, intruder, room=4)] == [[1, 2, 3]]
    finally:
        intruder.close(), rld.close()


def test_start_up_needs_an_allowlist_with_curve(pairs, tmp_path):
    base = {curve.ENV_KEY: pairs["relay_secret"].decode()}
    with pytest.raises(ChannelKeyError, match="SGLANG_PDD_TOKEN_CURVE_CLIENTS .*is not set"):
        keys.curve_clients("auto", base)
    assert keys.curve_clients("auto", {}) is None  # no CURVE: nothing to admit
    assert keys.curve_clients("off", base) is None  # nor with CURVE off
    assert keys.curve_clients("auto", {**base, curve.ENV_CLIENTS: "*"}) is None  # the explicit opt-out
    other = zmq.curve_keypair()[0]
    listed = f"{pairs['allowed_public'].decode()}, {other.decode()}"
    assert keys.curve_clients("auto", {**base, curve.ENV_CLIENTS: listed}) == {pairs["allowed_public"], other}
    f = tmp_path / "clients"
    f.write_text(f"# MainDecode a\n{pairs['allowed_public'].decode()}\n\n# b\n{other.decode()}\n")
    from_file = {**base, curve.ENV_CLIENTS + "_FILE": str(f)}
    assert keys.curve_clients("auto", from_file) == {pairs["allowed_public"], other}
    for bad, match in ((f"{other.decode()} short", "entry 2 is not a Z85 CURVE public key"),
                       ("# nothing\n", "no key")):
        with pytest.raises(ChannelKeyError, match=match):
            keys.curve_clients("auto", {**base, curve.ENV_CLIENTS: bad})
    md_env = {curve.ENV_KEY: pairs["relay_public"].decode()}
    assert keys.curve_client_key("auto", md_env) is None
    own = {**md_env, curve.ENV_CLIENT_KEY: pairs["allowed_secret"].decode()}
    assert keys.curve_client_key("auto", own) == pairs["allowed_secret"]
    with pytest.raises(ChannelKeyError, match="SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY: not a Z85 CURVE key"):
        keys.curve_client_key("auto", {**md_env, curve.ENV_CLIENT_KEY: "short"})


def test_the_key_tool_writes_a_named_pair(tmp_path):
    assert curve.main([str(tmp_path), "main-a"]) == 0
    secret = (tmp_path / "main-a.key").read_bytes().strip()
    assert zmq.curve_public(secret) == (tmp_path / "main-a.pub").read_bytes().strip()
    assert curve.main([str(tmp_path), "../elsewhere"]) == 2


def test_a_relay_with_curve_and_no_allowlist_refuses_to_start(pairs, monkeypatch):
    import argparse

    from sglang_pdd import config

    parser = argparse.ArgumentParser()
    config.add_cli_args(parser)
    args = parser.parse_args(["--pdd-role", "relay", "--pdd-token-port", "18500"])
    monkeypatch.setenv(keys.ENV_SECRET, "s" * 32)
    monkeypatch.setenv(curve.ENV_KEY, pairs["relay_secret"].decode())
    with pytest.raises(PddConfigError, match="SGLANG_PDD_TOKEN_CURVE_CLIENTS"):
        config.from_cli_args(args, disaggregation_mode="decode")
    monkeypatch.setenv(curve.ENV_CLIENTS, pairs["allowed_public"].decode())
    cfg = config.from_cli_args(args, disaggregation_mode="decode")
    assert keys.curve_clients(cfg.token_curve) == {pairs["allowed_public"]}


def test_a_relay_that_cannot_bind_leaves_no_zap_thread(pairs):
    import threading

    first = relay(pairs, frozenset({pairs["allowed_public"]}))
    threads = threading.active_count()
    try:
        with pytest.raises(zmq.ZMQError):
            RelayChannel(first.address, SECRET, curve_key=pairs["relay_secret"], curve_clients=frozenset())
        assert threading.active_count() == threads
    finally:
        first.close()
