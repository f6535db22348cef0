"""Messages of the token channel between MainDecode (client) and RelayDecode (server).

    MD -> RLD  Hello()            this connection is mine: sent after each (re)connection, so the relay
                                  sends the session's replies here (`protocol.channel`); room 0, never
                                  handed to the relay's state machine
    MD -> RLD  Watch(room)        MD admitted the request; tell me if you finish it yourself
    MD -> RLD  Ready(room, have, mode, chunk, gap, md_batch)
                                  my KV covers the prompt and `have` eager tokens: send what follows.
                                  mode "one-shot": all of them at once, and stop; "catch-up": at most
                                  `chunk` at a time while you keep decoding, the last (final) one once
                                  at most `gap` remain; "adaptive": RLD picks from its load and md_batch
    RLD -> MD  Tokens(room, start, ids, final, mode)   eager tokens t(start+1).. ; final: RLD stopped
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

MAX_TOKENS_PER_MESSAGE = 1 << 18  # a frame of that many ids and logprobs stays under channel.MAX_FRAME


class ProtocolError(ValueError):
    """A message that cannot be accepted; `reason` is a short label for counters."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class _Msg(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    room: int
    v: int = PROTOCOL_VERSION


class Hello(_Msg, tag="hello"):
    room: int = 0  # about no request


class Watch(_Msg, tag="watch"):
    pass


HANDOFF_MODES = ("one-shot", "catch-up", "adaptive")
CHOSEN_MODES = HANDOFF_MODES[:2]  # what a relay hands off with (adaptive is a request, not a choice)
MAX_CHUNK = 1 << 16


class Ready(_Msg, tag="ready"):
    have: int = 0  # eager tokens whose KV MD already computed (catch-up rounds after the first)
    mode: str = "one-shot"
    chunk: int = 0  # catch-up: the most tokens per non-final Tokens message
    gap: int = 2  # catch-up: finish once at most this many tokens remain
    md_batch: int = 0  # requests decoding on MD (an input of the adaptive choice)


class Tokens(_Msg, tag="tokens"):
    start: int = 0
    ids: list[int] = []
    final: bool = True
    logprobs: list[float] | None = None  # output logprobs of ids, when the request asked for them
    mode: str = "one-shot"  # the mode RLD chose for this handoff


class Finished(_Msg, tag="finished"):
    reason: str = ""
    n_tokens: int = 0


class Reject(_Msg, tag="reject"):
    reason: str = ""


Message = Union[Hello, Watch, Ready, Tokens, Finished, Reject]
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
    if isinstance(msg, Ready) and (msg.mode not in HANDOFF_MODES or not 0 <= msg.have <= MAX_TOKENS_PER_MESSAGE
                                   or not 0 <= msg.chunk <= MAX_CHUNK or not 0 <= msg.gap <= MAX_CHUNK
                                   or msg.md_batch < 0 or (msg.mode != "one-shot" and msg.chunk < 1)):
        raise ProtocolError("malformed", f"ready: mode {msg.mode!r}, have {msg.have}, chunk {msg.chunk}, gap {msg.gap}")
    if isinstance(msg, Tokens):
        if msg.start < 0 or len(msg.ids) > MAX_TOKENS_PER_MESSAGE or msg.mode not in CHOSEN_MODES or (
                msg.logprobs is not None and len(msg.logprobs) != len(msg.ids)):
            raise ProtocolError("malformed", f"tokens: start {msg.start}, {len(msg.ids)} ids")
        if vocab_size is not None and any(t < 0 or t >= vocab_size for t in msg.ids):
            raise ProtocolError("out_of_vocab", f"tokens for room {msg.room}: id outside [0, {vocab_size})")
    return msg
