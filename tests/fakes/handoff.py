"""The token channel and sglang's request as RLD's and MD's handoff state machines see them
(sglang_pdd.decode.relay.handoff, sglang_pdd.decode.main.handoff)."""

from __future__ import annotations

from dataclasses import dataclass, field


class FakeChannel:
    """The token channel: what the peer sent, delivered on the next `poll`; what this side `send`s."""

    def __init__(self):
        self.inbox: list = []  # (peer, msg) to deliver on the next poll
        self.sent: list = []

    def poll(self):
        out, self.inbox = self.inbox, []
        return out

    def send(self, peer, msg):
        self.sent.append((peer, msg))
        return True


@dataclass
class FakeReason:
    """sglang's finish reason (`FINISH_ABORT`, ...): its `to_json` type."""

    type: str

    def to_json(self):
        return {"type": self.type}


@dataclass
class FakeReq:
    """sglang's `Req`: its rid, bootstrap room, output so far, and whether it finished."""

    rid: str
    bootstrap_room: int
    output_ids: list = field(default_factory=list)
    finished_reason: object = None

    def finished(self):
        return self.finished_reason is not None
