"""The token channel's shared secret from the environment or a mounted file: the file's trailing
newline is not part of it; a missing, empty, short or doubly given secret is an error naming the
variable. (The CURVE keys: test_token_curve, test_token_curve_allowlist.)"""

import pytest

from sglang_pdd.protocol import keys
from sglang_pdd.protocol.keys import ChannelKeyError


def test_secret_comes_from_the_environment_or_a_file(tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(b"s3cret-of-16-bytes\n")  # as `echo ... > file` writes it: the newline is not part of the key
    assert keys.secret({keys.ENV_SECRET: "s3cret-of-16-bytes"}) == keys.secret({keys.ENV_SECRET_FILE: str(f)}) \
        == b"s3cret-of-16-bytes"
    f.write_bytes(b"s3cret-of-16-bytes")
    assert keys.secret({keys.ENV_SECRET_FILE: str(f)}) == b"s3cret-of-16-bytes"


@pytest.mark.parametrize("content, env, match", [
    (None, {}, "SGLANG_PDD_SECRET .or SGLANG_PDD_SECRET_FILE. is not set"),
    (b"\n", {"file": True}, "is empty"),
    (None, {"file": True}, "cannot read"),
    (b"x", {"file": True, keys.ENV_SECRET: "x"}, "set one"),
    (None, {keys.ENV_SECRET: "x"}, "SGLANG_PDD_SECRET: the secret is 1 bytes, at least 16"),
    (None, {keys.ENV_SECRET: "fifteen-bytes.."}, "SGLANG_PDD_SECRET: the secret is 15 bytes"),
    (b"short\n", {"file": True}, "SGLANG_PDD_SECRET_FILE: the secret is 5 bytes, at least 16"),
])
def test_a_missing_empty_or_doubly_given_secret_is_a_clear_error(tmp_path, content, env, match):
    f = tmp_path / "secret"
    if content is not None:
        f.write_bytes(content)
    environ = {k: v for k, v in env.items() if k != "file"}
    if env.get("file"):
        environ[keys.ENV_SECRET_FILE] = str(f)
    with pytest.raises(ChannelKeyError, match=match):
        keys.secret(environ)


def test_an_optional_secret_is_none_only_when_neither_variable_is_set(tmp_path):
    assert keys.optional_secret({}) is None
    assert keys.optional_secret({keys.ENV_SECRET: "s" * 16}) == b"s" * 16
    with pytest.raises(ChannelKeyError, match="cannot read"):  # given, so it must be readable
        keys.optional_secret({keys.ENV_SECRET_FILE: str(tmp_path / "absent")})
