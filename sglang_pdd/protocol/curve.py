"""Encryption of the token channel with ZMQ's own CURVE (CurveZMQ), for frames that cross the WAN.

The frames are authenticated (HMAC) and replay-bound without it; CURVE adds confidentiality: the token
IDs of a user's output no longer cross the WAN in plaintext. One keypair per relay deployment, as Z85
text (`python -m sglang_pdd.protocol.curve OUTDIR` writes `relay.key` and `relay.pub`):

* the relay (CURVE server) holds the **secret** key: `SGLANG_PDD_TOKEN_CURVE_KEY` or the file named by
  `SGLANG_PDD_TOKEN_CURVE_KEY_FILE` (e.g. a mounted Secret);
* MainDecode (CURVE client) holds the relay's **public** key in the same variable, and its own secret
  key in `SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY` (or `..._FILE`; `python -m sglang_pdd.protocol.curve OUTDIR
  main` writes `main.key` and `main.pub`);
* the relay admits only the MainDecode public keys in `SGLANG_PDD_TOKEN_CURVE_CLIENTS` (comma- or
  space-separated Z85 keys) or the file `SGLANG_PDD_TOKEN_CURVE_CLIENTS_FILE` names (one per line, `#`
  comments): any other client fails the CURVE handshake at the relay's ZAP handler
  (`protocol.curve_zap`), before a frame of it is read. A relay with CURVE and no allowlist refuses to
  start; `*` is the explicit opt-out (any client key completes the handshake: the relay's public key
  is no secret, so anyone can then reach the socket, whose frames the HMAC still drops). An MD
  without its own key draws one per connection: only a relay with `*` admits it.

`--pdd-token-curve auto` (default) encrypts when a key is configured, and refuses to start a relay
without one whose token channel other hosts reach (its --host not a loopback address: `keys`); `on`
refuses to start without a key, `off` never encrypts (the explicit opt-out, for a link that is private
or encrypted already). Both ends must agree: a plaintext peer of an encrypting one never completes
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
ENV_CLIENT_KEY = "SGLANG_PDD_TOKEN_CURVE_CLIENT_KEY"  # MD: its own secret key
ENV_CLIENTS = "SGLANG_PDD_TOKEN_CURVE_CLIENTS"  # relay: the MD public keys it admits, or ANY_CLIENT
ANY_CLIENT = "*"


class CurveKeyError(ValueError):
    pass


def load_key(environ: dict | None = None, name: str = ENV_KEY) -> bytes | None:
    """The Z85 key (40 characters) in `name` or the file `name`_FILE names, None when neither is set."""
    data, source = _read(environ, name)
    if not data:
        return None
    key = data.strip()
    if not _is_key(key):
        raise CurveKeyError(f"{source}: not a Z85 CURVE key (40 characters)")
    return key


def load_clients(environ: dict | None = None) -> frozenset[bytes] | str | None:
    """The relay's allowlist: the Z85 public keys in `SGLANG_PDD_TOKEN_CURVE_CLIENTS` (or the file
    `..._FILE` names), ANY_CLIENT for `*`, None when neither variable is set."""
    data, source = _read(environ, ENV_CLIENTS)
    if data is None:
        return None
    words = [w for line in data.splitlines() if not line.lstrip().startswith(b"#")
             for w in line.replace(b",", b" ").split()]
    if words == [ANY_CLIENT.encode()]:
        return ANY_CLIENT
    bad = [i for i, w in enumerate(words, 1) if not _is_key(w)]
    if bad or not words:
        raise CurveKeyError(f"{source}: entry {bad[0]} is not a Z85 CURVE public key (40 characters)" if bad else
                            f"{source}: no key (give MainDecode's public keys, or {ANY_CLIENT} for any)")
    return frozenset(words)


def _read(environ: dict | None, name: str) -> tuple[bytes | None, str]:
    try:
        return env_or_file(environ if environ is not None else os.environ, name, name + "_FILE")
    except ValueError as e:
        raise CurveKeyError(str(e)) from None


def _is_key(key: bytes) -> bool:
    try:
        return len(key) == 40 and len(zmq.utils.z85.decode(key)) == 32
    except Exception:
        return False


def serve(sock: zmq.Socket, secret_key: bytes) -> None:
    """Make a socket, before it binds, a CURVE server with this secret key."""
    sock.curve_secretkey = secret_key
    sock.curve_publickey = zmq.curve_public(secret_key)
    sock.curve_server = True


def connect_to(sock: zmq.Socket, server_public_key: bytes, secret_key: bytes | None = None) -> None:
    """Make a socket, before it connects, a CURVE client of the server with this public key, with
    this secret key (its public key on the server's allowlist) or a keypair drawn now."""
    public, secret = (zmq.curve_public(secret_key), secret_key) if secret_key else zmq.curve_keypair()
    sock.curve_serverkey = server_public_key
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def write_pair(outdir: str, stem: str) -> tuple[str, str]:
    """A fresh keypair as `stem`.key (the secret key, mode 0600) and `stem`.pub (0644) in `outdir`; their paths."""
    public, secret = zmq.curve_keypair()
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for name, key, mode in ((stem + ".key", secret, 0o600), (stem + ".pub", public, 0o644)):
        path = os.path.join(outdir, name)
        if os.path.lexists(path):
            os.unlink(path)  # a fresh file with this mode (O_CREAT keeps an old file's)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(key + b"\n")
        paths.append(path)
    return paths[0], paths[1]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m sglang_pdd.protocol.curve OUTDIR [NAME]  (writes NAME.key and NAME.pub; "
              "NAME: relay by default, e.g. main-a for a MainDecode's pair)", file=sys.stderr)
        return 2
    stem = argv[1] if len(argv) == 2 else "relay"
    if not stem or os.path.basename(stem) != stem or stem.startswith("."):
        print(f"NAME: {stem!r} is not a plain file name", file=sys.stderr)
        return 2
    for path in write_pair(argv[0], stem):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
