"""Messages of the token channel between MainDecode (client) and RelayDecode (server).

    MD -> RLD  Watch(room)        MD admitted the request; tell me if you finish it yourself
    MD -> RLD  Ready(room)        my KV transfer succeeded: send the eager tokens and stop
    RLD -> MD  Tokens(room, start, ids, final)   the eager tokens t1..tk from index `start`
    RLD -> MD  Finished(room, reason, n_tokens)   RLD completed the request itself (EOS, length,
                                                  abort): MD must abort its transfer and free its slots
    RLD -> MD  Reject(room, reason)               the message could not be served (unknown room, ...)

Encoded with msgspec (msgpack), by field name, tagged by `type`, every message carrying the protocol
version. `decode()` rejects anything else with a `ProtocolError` that says why.
"""

from __future__ import annotations

from typing import Union

import msgspec

from sglang_pdd.protocol import PROTOCOL_VERSION

MAX_TOKENS_PER_MESSAGE = 1 << 20


class ProtocolError(ValueError):
    """A message that cannot be accepted; `reason` is a short label for counters."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _Msg(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    room: int
    v: int = PROTOCOL_VERSION


class Watch(_Msg, tag="watch"):
    pass


class Ready(_Msg, tag="ready"):
    pass


class Tokens(_Msg, tag="tokens"):
    start: int = 0
    ids: list[int] = []
    final: bool = True
    logprobs: list[float] | None = None  # output logprobs of ids, when the request asked for them


class Finished(_Msg, tag="finished"):
    reason: str = ""
    n_tokens: int = 0


class Reject(_Msg, tag="reject"):
    reason: str = ""


Message = Union[Watch, Ready, Tokens, Finished, Reject]
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_version_probe = msgspec.msgpack.Decoder(dict)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes, vocab_size: int | None = None) -> Message:
    try:
        head = _version_probe.decode(data)
    except msgspec.DecodeError as e:
        raise ProtocolError("malformed", str(e)) from None
    if head.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {head.get('v')!r}, this side speaks {PROTOCOL_VERSION}")
    try:
        msg = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ProtocolError("malformed", str(e)) from None
    if isinstance(msg, Tokens):
        if msg.start < 0 or len(msg.ids) > MAX_TOKENS_PER_MESSAGE or (
                msg.logprobs is not None and len(msg.logprobs) != len(msg.ids)):
            raise ProtocolError("malformed", f"tokens: start {msg.start}, {len(msg.ids)} ids")
        if vocab_size is not None and any(t < 0 or t >= vocab_size for t in msg.ids):
            raise ProtocolError("out_of_vocab", f"tokens for room {msg.room}: id outside [0, {vocab_size})")
    return msg
