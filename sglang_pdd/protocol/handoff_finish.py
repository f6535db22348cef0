"""The finish reason RelayDecode ends a handed-over request with (its stream then holds exactly t1..tk):

    {"type": "pdd_handoff", "handoff_tokens": k, "mode": "one-shot" | "catch-up", "v": 1}

RLD builds it (`relay/runtime.py`); the router (`router/request/stitch.py`) and a client driving the roles
itself (`testing/pdd_client.py`) read k from it. The router never shows it to its client. A finish
without `v` is read as this version (as the token channel's messages are).
"""

from __future__ import annotations

import msgspec

from sglang_pdd.protocol import PROTOCOL_VERSION
from sglang_pdd.protocol.messages import CHOSEN_MODES

TYPE = "pdd_handoff"


class HandoffFinishError(ValueError):
    """A `pdd_handoff` finish that cannot be accepted (malformed, unknown version)."""


class HandoffFinish(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag=TYPE):
    handoff_tokens: int  # k: the eager tokens RLD streamed and MD took over
    mode: str | None = None  # one-shot or catch-up, as RLD chose it (None: not said)
    v: int = PROTOCOL_VERSION

    def to_finish(self) -> dict:
        """The finish reason as sglang's `BaseFinishReason.to_json()` returns it."""
        out: dict = {"type": TYPE, "handoff_tokens": self.handoff_tokens}
        if self.mode is not None:
            out["mode"] = self.mode
        out["v"] = self.v
        return out

    @classmethod
    def from_finish(cls, finish: object) -> "HandoffFinish | None":
        """The handoff in a stream's finish reason; None for any other finish (EOS, length, abort,
        none yet). A `pdd_handoff` finish that is malformed or of another version raises, and so
        does a finish reason that is not an object (sglang's always is)."""
        if finish is None:
            return None
        if not isinstance(finish, dict):
            raise HandoffFinishError(f"a finish reason is an object, got {type(finish).__name__}")
        if finish.get("type") != TYPE:
            return None
        v = finish.get("v", PROTOCOL_VERSION)
        if v != PROTOCOL_VERSION:
            raise HandoffFinishError(f"{TYPE} finish: protocol version {v!r}, this side speaks {PROTOCOL_VERSION}")
        try:
            out = msgspec.convert(finish, cls)
        except msgspec.ValidationError as e:
            raise HandoffFinishError(f"{TYPE} finish: {e}") from None
        if out.handoff_tokens < 0 or (out.mode is not None and out.mode not in CHOSEN_MODES):
            raise HandoffFinishError(f"{TYPE} finish: {out.handoff_tokens} tokens, mode {out.mode!r}")
        return out
