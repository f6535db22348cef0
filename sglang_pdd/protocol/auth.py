"""HMAC-SHA256 over every token-channel frame, with a secret shared by RLD and MD.

Frame = 32-byte MAC || payload. The secret comes from `SGLANG_PDD_SECRET` or the file `SGLANG_PDD_SECRET_FILE`
names (`protocol.keys.secret`; never a command line, which
`ps` shows); without one the channel refuses to start on a non-loopback address.
"""

from __future__ import annotations

import hashlib
import hmac

from sglang_pdd.protocol.messages import ProtocolError

MAC_LEN = 32


class FrameAuth:
    def __init__(self, secret: bytes):
        if not secret:
            raise ValueError("empty token-channel secret")
        self._key = secret

    def seal(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest() + payload

    def open(self, frame: bytes) -> bytes:
        if len(frame) < MAC_LEN:
            raise ProtocolError("bad_mac", f"frame of {len(frame)} bytes is shorter than its MAC")
        mac, payload = frame[:MAC_LEN], frame[MAC_LEN:]
        if not hmac.compare_digest(mac, hmac.new(self._key, payload, hashlib.sha256).digest()):
            raise ProtocolError("bad_mac", "MAC does not match (wrong secret or tampered frame)")
        return payload
