"""CURVE on the token channel over real ZMQ through a recording TCP proxy: encrypted, the frames on the
wire carry no plaintext token IDs and MD and RLD still talk; in plaintext they do carry them (the
control); a plaintext MD never reaches an encrypting relay; keys are checked at start-up."""

import os

import pytest
import zmq

from sglang_pdd.config import PddConfig, PddConfigError
from sglang_pdd.protocol import curve, keys
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.keys import ChannelKeyError
from sglang_pdd.protocol.messages import Ready, Tokens
from sglang_pdd.server.roles import Role

from .tcp_proxy import Proxy
from .test_token_channel import wait_for

SECRET = b"k"
IDS = [1000 + i for i in range(64)]  # msgpack: uint16 0xcd 0x03 0xe8, 0xcd 0x03 0xe9, ...


def exchange(relay_key, main_key):
    """Ready from MD, Tokens back from RLD, through the proxy; (what MD got, the bytes on the wire)."""
    relay = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=2048, curve_key=relay_key)
    proxy = Proxy(int(relay.address.rsplit(":", 1)[1]))
    main = MainChannel(SECRET, vocab_size=2048, curve_key=main_key)
    addr = f"tcp://127.0.0.1:{proxy.port}"
    try:
        main.send(addr, Ready(room=7, have=0, mode="one-shot"))
        got = wait_for(relay.poll, timeout=3.0)
        if not got:
            return [], bytes(proxy.seen)
        peer, _ = got[0]
        relay.send(peer, Tokens(room=7, start=0, ids=IDS, final=True))
        return wait_for(main.poll, timeout=10.0), bytes(proxy.seen)
    finally:
        main.close(), relay.close(), proxy.close()


def plaintext_ids() -> bytes:
    return b"".join(b"\xcd" + i.to_bytes(2, "big") for i in IDS[:8])


def test_encrypted_frames_carry_no_plaintext_and_still_arrive():
    public, secret = zmq.curve_keypair()
    got, wire = exchange(secret, public)
    assert [m.ids for _, m in got] == [IDS]
    assert plaintext_ids() not in wire and len(wire) > 0


def test_control_plaintext_frames_show_the_token_ids_on_the_wire():
    got, wire = exchange(None, None)
    assert [m.ids for _, m in got] == [IDS]
    assert plaintext_ids() in wire  # what the encrypted test shows is absent


def test_a_plaintext_main_never_reaches_an_encrypting_relay():
    _, secret = zmq.curve_keypair()
    got, _ = exchange(secret, None)
    assert got == []


def test_keys_and_the_flag_at_start_up(tmp_path):
    public, secret = zmq.curve_keypair()
    f = tmp_path / "relay.key"
    f.write_bytes(secret + b"\n")
    assert keys.curve_key("auto", {curve.ENV_KEY_FILE: str(f)}) == secret
    assert keys.curve_key("auto", {}) is None  # auto without a key: plaintext
    assert keys.curve_key("off", {curve.ENV_KEY: public.decode()}) is None
    with pytest.raises(ChannelKeyError, match="--pdd-token-curve on: no key"):
        keys.curve_key("on", {})
    with pytest.raises(ChannelKeyError, match="not a Z85 CURVE key"):
        keys.curve_key("auto", {curve.ENV_KEY: "short"})
    with pytest.raises(ChannelKeyError, match="set one"):
        keys.curve_key("auto", {curve.ENV_KEY: public.decode(), curve.ENV_KEY_FILE: str(f)})
    with pytest.raises(PddConfigError, match="--pdd-token-curve: invalid choice"):
        PddConfig.from_json(PddConfig(role=Role.MAIN, token_curve="maybe").to_json())


def test_the_key_tool_writes_a_pair(tmp_path):
    assert curve.main([str(tmp_path)]) == 0
    secret = (tmp_path / "relay.key").read_bytes().strip()
    assert zmq.curve_public(secret) == (tmp_path / "relay.pub").read_bytes().strip()
    assert os.stat(tmp_path / "relay.key").st_mode & 0o077 == 0
