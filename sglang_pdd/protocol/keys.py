"""The token channel's keys: the shared secret and the CURVE keys, from the environment or mounted files.

The shared secret (`SGLANG_PDD_SECRET`, or the file `SGLANG_PDD_SECRET_FILE` names) keys the token
channel's frame MACs and the signed PDD parameters (protocol.auth, protocol.request_auth): relay and
main need one, a prefill and the router use one where it is set. The CURVE keys (protocol.curve)
encrypt the channel as `--pdd-token-curve` (its value is the `mode` here: auto, on, off) asks.

Each missing or unreadable key is a `ChannelKeyError` whose message names the variable or the flag;
`config.from_cli_args` turns it into the `PddConfigError` a server refuses to start with. A relay whose
token channel other hosts reach (its --host not a loopback address) must encrypt it unless told
otherwise (`refuse_clear_channel`: `--pdd-token-curve off` is the explicit opt-out).
"""

from __future__ import annotations

import ipaddress
import os

from sglang_pdd.protocol.env_secret import env_or_file

MIN_SECRET_BYTES = 16  # a shorter shared secret is refused at start-up, naming the variable
ENV_SECRET = "SGLANG_PDD_SECRET"  # shared secret of the token channel (never put on a command line)
ENV_SECRET_FILE = "SGLANG_PDD_SECRET_FILE"  # or: a file holding it (a mounted Kubernetes Secret, a 0600 file)


class ChannelKeyError(ValueError):
    """A key of the token channel is missing, unreadable or malformed (the message names where from)."""


def secret(environ: dict | None = None) -> bytes:
    """The token channel's shared secret: `SGLANG_PDD_SECRET`, or the contents of the file
    `SGLANG_PDD_SECRET_FILE` names (one trailing newline dropped); relay and main need one."""
    env = environ if environ is not None else os.environ
    try:
        data, source = env_or_file(env, ENV_SECRET, ENV_SECRET_FILE)
    except ValueError as e:
        raise ChannelKeyError(str(e)) from None
    if source == ENV_SECRET_FILE and not (data or b"").strip():
        raise ChannelKeyError(f"{ENV_SECRET_FILE}: {env[ENV_SECRET_FILE]} is empty")
    if not data:
        raise ChannelKeyError(f"{ENV_SECRET} (or {ENV_SECRET_FILE}) is not set: RelayDecode and MainDecode "
                              "authenticate the token channel with it (the same value on both)")
    if len(data) < MIN_SECRET_BYTES:
        raise ChannelKeyError(f"{source}: the secret is {len(data)} bytes, at least {MIN_SECRET_BYTES} are needed "
                              "(it keys the token channel's and the signed parameters' MACs; e.g. "
                              "`openssl rand -hex 32`)")
    return data


def optional_secret(environ: dict | None = None) -> bytes | None:
    """The shared secret where one is set (a prefill needs none), else None."""
    env = environ if environ is not None else os.environ
    if not env.get(ENV_SECRET) and not env.get(ENV_SECRET_FILE):
        return None
    return secret(env)


def curve_key(mode: str, environ: dict | None = None) -> bytes | None:
    """The token channel's CURVE key (relay: its secret key, main: the relay's public key), or None
    when the channel is not encrypted; `mode` is `--pdd-token-curve` (auto, on, off)."""
    # protocol.curve imports zmq; the router and the plugin load config (and call this module) without it
    from sglang_pdd.protocol.curve import ENV_KEY, CurveKeyError, load_key

    if mode == "off":
        return None
    try:
        key = load_key(environ)
    except CurveKeyError as e:
        raise ChannelKeyError(f"--pdd-token-curve: {e}") from None
    if key is None and mode == "on":
        raise ChannelKeyError(f"--pdd-token-curve on: no key ({ENV_KEY} or {ENV_KEY}_FILE is not set)")
    return key


def is_loopback(host: str | None) -> bool:
    """Whether a server bound on `host` (its --host) is reachable from this host only. Empty or None:
    every address (the relay binds 0.0.0.0 then); a name other than localhost is not resolved: not loopback."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_clear_channel(mode: str, host: str | None, environ: dict | None = None) -> None:
    """Relay: under `--pdd-token-curve auto`, a token channel that other hosts reach (bound on `host`,
    not a loopback address) needs a CURVE key: the relayed requests' output tokens (the users' text)
    would cross the network in clear. `off` is the explicit opt-out, `on` needs a key anyway."""
    from sglang_pdd.protocol.curve import ENV_CLIENTS, ENV_KEY

    if mode != "auto" or is_loopback(host) or curve_key(mode, environ) is not None:
        return
    raise ChannelKeyError(
        f"--pdd-token-curve auto: the token channel binds on {host or 'every address'} (--host), which other "
        f"hosts reach, and no CURVE key is set, so every relayed request's output tokens would cross the network "
        f"in clear. Set {ENV_KEY} (or {ENV_KEY}_FILE) and {ENV_CLIENTS} (or {ENV_CLIENTS}_FILE): `python -m "
        "sglang_pdd.protocol.keygen OUTDIR` writes every key a deployment needs; or pass --pdd-token-curve off "
        "to send it in clear (only over a link that is private or encrypted already: IPsec, WireGuard)")


def curve_clients(mode: str, environ: dict | None = None) -> frozenset[bytes] | None:
    """Relay: the MainDecode public keys its CURVE handshake admits (protocol.curve_zap); None when
    the channel is not encrypted or the allowlist is the explicit `*` (any key)."""
    from sglang_pdd.protocol.curve import ANY_CLIENT, ENV_CLIENTS, CurveKeyError, load_clients

    if curve_key(mode, environ) is None:
        return None
    try:
        clients = load_clients(environ)
    except CurveKeyError as e:
        raise ChannelKeyError(f"--pdd-token-curve: {e}") from None
    if clients is None:
        raise ChannelKeyError(f"--pdd-token-curve: the relay encrypts, but {ENV_CLIENTS} (or {ENV_CLIENTS}_FILE) "
                              "is not set: list the public keys of the MainDecode servers it admits, or "
                              f"'{ANY_CLIENT}' to admit any key (the frames' HMAC is then the only check)")
    return None if clients == ANY_CLIENT else clients


def curve_client_key(mode: str, environ: dict | None = None) -> bytes | None:
    """Main: its own CURVE secret key (its public key goes on the relays' allowlists); None when
    the channel is not encrypted or none is set (a keypair is drawn per connection)."""
    from sglang_pdd.protocol.curve import ENV_CLIENT_KEY, CurveKeyError, load_key

    if curve_key(mode, environ) is None:
        return None
    try:
        return load_key(environ, ENV_CLIENT_KEY)
    except CurveKeyError as e:
        raise ChannelKeyError(f"--pdd-token-curve: {e}") from None
