"""`python -m sglang_pdd.protocol.keygen OUTDIR`: every key file a deployment needs, each read back by the
reader that uses it (the plugin's and the router's, sglang's --config merge for the roles' --api-key),
secrets 0600, nothing overwritten without --force."""

from __future__ import annotations

import argparse
import os
import stat

import pytest
import zmq

from sglang_pdd.protocol import curve, keygen, keys
from sglang_pdd.router.peers import role_auth


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_file_is_made_and_read_by_its_reader(tmp_path):
    out = tmp_path / "keys"
    assert keygen.main([str(out), "--main", "main-b", "--main", "main-c"]) == 0
    assert sorted(os.listdir(out)) == sorted(keygen.files(["main-b", "main-c"]))
    assert _mode(out) == 0o700
    for name in os.listdir(out):
        assert _mode(out / name) == (0o644 if name.endswith(".pub") or name == keygen.CLIENTS else 0o600), name
    f = lambda name: str(out / name)  # noqa: E731
    assert len(keys.secret({keys.ENV_SECRET_FILE: f("secret")})) >= keys.MIN_SECRET_BYTES
    role_key = role_auth.load({role_auth.ENV_KEY_FILE: f("role-api-key")})
    assert role_key and len(role_key) == 64
    relay = {"SGLANG_PDD_TOKEN_CURVE_KEY_FILE": f("relay.key"), "SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE": f("curve-clients")}
    main = {"SGLANG_PDD_TOKEN_CURVE_KEY_FILE": f("relay.pub"), "SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY_FILE": f("main-c.key")}
    admitted = keys.curve_clients("on", relay)
    assert zmq.curve_public(keys.curve_key("on", relay)) == keys.curve_key("on", main)  # MD holds RLD's public key
    assert zmq.curve_public(keys.curve_client_key("on", main)) in admitted and len(admitted) == 2
    keys.refuse_clear_channel("auto", "0.0.0.0", relay)  # an encrypting relay may bind anywhere


def test_the_roles_read_the_role_key_through_sglangs_config_file(tmp_path):
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    keygen.write(str(tmp_path), ["main"])
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    argv = ConfigArgumentMerger(p).merge_config_with_args(
        ["--model-path", "m", "--config", str(tmp_path / keygen.ROLE_CONFIG)])
    assert p.parse_args(argv).api_key == (tmp_path / keygen.ROLE_KEY).read_text().strip()


def test_nothing_is_overwritten_without_force(tmp_path, capsys):
    keygen.write(str(tmp_path), ["main"])
    before = (tmp_path / "secret").read_text()
    assert keygen.main([str(tmp_path)]) == 2 and "exist already" in capsys.readouterr().err
    assert (tmp_path / "secret").read_text() == before
    (tmp_path / "relay.key").chmod(0o644)
    assert keygen.main([str(tmp_path), "--force"]) == 0
    assert (tmp_path / "secret").read_text() != before and _mode(tmp_path / "relay.key") == 0o600


@pytest.mark.parametrize("mains", [["relay"], ["../x"], [".hidden"], ["a", "a"], [""]])
def test_a_bad_main_name_is_refused(tmp_path, mains):
    with pytest.raises(ValueError, match="--main"):
        keygen.write(str(tmp_path), mains)
    assert not os.listdir(tmp_path)


def test_curves_own_pair_writer_replaces_a_loose_mode(tmp_path):
    key, pub = curve.write_pair(str(tmp_path), "relay")
    os.chmod(key, 0o644)
    curve.write_pair(str(tmp_path), "relay")
    assert _mode(key) == 0o600 and _mode(pub) == 0o644
