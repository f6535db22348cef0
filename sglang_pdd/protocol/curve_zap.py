"""Which CURVE clients a relay's token channel admits: a ZAP handler (pyzmq's `ThreadAuthenticator`)
that passes only the MainDecode public keys on the relay's allowlist (`protocol.curve`).

libzmq asks the ZAP handler of the socket's context during every CURVE handshake, from its I/O thread;
the authenticator answers from its own thread, so the scheduler thread that polls the channel never
waits on it. A refused client's handshake fails: nothing it sends reaches the socket. The handler
serves one context, so the relay's socket gets a context of its own (no other socket of the process
is subject to it).
"""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator

logger = logging.getLogger(__name__)

MAX_LOGGED = 64  # distinct refused keys logged (each once); all refusals are counted


class ClientAllowlist:
    """A started ZAP handler on `ctx` admitting the CURVE clients whose Z85 public key is in `keys`."""

    def __init__(self, ctx: zmq.Context, keys: frozenset[bytes]):
        self.keys = frozenset(keys)
        self.refused = 0  # handshakes refused so far (written by the authenticator's thread only)
        self._logged: set[bytes] = set()
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger(__name__ + ".zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """pyzmq's credentials-provider hook: is this Z85 public key on the allowlist?"""
        if client_key in self.keys:
            return True
        self.refused += 1
        if client_key not in self._logged and len(self._logged) < MAX_LOGGED:
            self._logged.add(client_key)
            logger.warning("token channel: refused a CURVE client whose public key %s is not on the allowlist",
                           client_key.decode("ascii", "replace"))
        return False

    def stop(self) -> None:
        self._auth.stop()
