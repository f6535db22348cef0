"""Encryption of the token channel with ZMQ's own CURVE (CurveZMQ), for frames that cross the WAN.

The frames are authenticated (HMAC) and replay-bound without it; CURVE adds confidentiality: the token
IDs of a user's output no longer cross the WAN in plaintext. One keypair per relay deployment, as Z85
text (`python -m sglang_pdd.protocol.curve OUTDIR` writes `relay.key` and `relay.pub`):

* the relay (CURVE server) holds the **secret** key: `SGLANG_PDD_TOKEN_CURVE_KEY` or the file named by
  `SGLANG_PDD_TOKEN_CURVE_KEY_FILE` (e.g. a mounted Secret);
* MainDecode (CURVE client) holds the relay's **public** key in the same variable; its own keypair is
  drawn per connection (clients are authenticated by the HMAC, not by CURVE).

`--pdd-token-curve auto` (default) encrypts when a key is configured, `on` refuses to start without
one, `off` never encrypts. Both ends must agree: a plaintext peer of an encrypting one never completes
the handshake, so no frame passes (MD's request then fails at the handoff timeout).
"""

from __future__ import annotations

import os
import sys

import zmq
import zmq.utils.z85

from sglang_pdd.protocol.env_secret import env_or_file

ENV_KEY = "SGLANG_PDD_TOKEN_CURVE_KEY"
ENV_KEY_FILE = ENV_KEY + "_FILE"


class CurveKeyError(ValueError):
    pass


def load_key(environ: dict | None = None) -> bytes | None:
    """The configured Z85 key (40 characters), None when neither variable is set."""
    env = environ if environ is not None else os.environ
    try:
        data, source = env_or_file(env, ENV_KEY, ENV_KEY_FILE)
    except ValueError as e:
        raise CurveKeyError(str(e)) from None
    if not data:
        return None
    key = data.strip()
    try:
        ok = len(key) == 40 and len(zmq.utils.z85.decode(key)) == 32
    except Exception:
        ok = False
    if not ok:
        raise CurveKeyError(f"{source}: not a Z85 CURVE key (40 characters)")
    return key


def serve(sock: zmq.Socket, secret_key: bytes) -> None:
    """Make a socket, before it binds, a CURVE server with this secret key."""
    sock.curve_secretkey = secret_key
    sock.curve_publickey = zmq.curve_public(secret_key)
    sock.curve_server = True


def connect_to(sock: zmq.Socket, server_public_key: bytes) -> None:
    """Make a socket, before it connects, a CURVE client of the server with this public key."""
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_public_key
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sglang_pdd.protocol.curve OUTDIR  (writes relay.key and relay.pub)", file=sys.stderr)
        return 2
    public, secret = zmq.curve_keypair()
    os.makedirs(argv[0], exist_ok=True)
    for name, key, mode in (("relay.key", secret, 0o600), ("relay.pub", public, 0o644)):
        path = os.path.join(argv[0], name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(key + b"\n")
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
