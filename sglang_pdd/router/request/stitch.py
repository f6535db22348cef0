"""One client stream out of RelayDecode's and MainDecode's: no gap, no duplicate, exact text.

RLD streams t1..tk and ends with the internal `pdd_handoff` finish (`protocol.handoff_finish`, k = handoff_tokens); MD's
output then starts over at t1 (its `output_ids` hold the eager tokens it took over) and goes on. The
client sees t1..tk from RLD, then MD's tokens from index k on. If RLD finishes the request itself
(EOS, stop, length), its finish is final and MD's stream is ignored. The handoff finish never
reaches the client. Both feeds take a copy's cumulative `output_ids` (`router.request.output_view` builds
them from a server streaming deltas, `--incremental-streaming-output`). A migrated copy's outputs
follow the tokens the client already has (`resume`; `offset`), with a handoff of its own when it
goes P->RLD->MD.

Text is decoded here from the stitched token IDs (not taken from either server), so a multi-byte
character whose bytes straddle the handoff comes out whole: text that ends in an incomplete
character is held back until the next token completes it, or until the end (bytes that never complete
one: for a few tokens). Decoding is incremental, with the offsets of sglang's detokenizer
(`IncrementalText`): each chunk decodes a window of the last tokens, not the whole output (that was
O(n^2) router CPU per request).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from sglang_pdd.protocol.handoff_finish import HandoffFinish

REPLACEMENT = "\ufffd"
HOLD_TOKENS = 8  # uncommitted tokens whose text still ends in U+FFFD before the window is cut
TAIL_TOKENS = 3  # tokens a cut leaves uncommitted: the most an incomplete UTF-8 character can span


class StitchError(RuntimeError):
    pass


@dataclass
class Delta:
    token_ids: list[int]
    text: str
    finish_reason: dict | None = None  # set on the last delta


@dataclass
class IncrementalText:
    """sglang's incremental detokenization (`DetokenizerManager`): the text of the tokens from
    `read` on is decode(ids[surr:]) minus decode(ids[surr:read]), the tokens before `read` serving
    as context (a tokenizer may decode a token differently at the start of a sequence). The offsets
    move on only once the new text is complete; until then its complete prefix is sent and
    remembered (`pending`), so nothing is sent twice.

    Bounded where sglang is not: sglang holds the offsets for as long as the text ends in U+FFFD, so
    a stream of bytes that never complete a character (lone continuation bytes) re-decodes the whole
    output at every step. Here, once `HOLD_TOKENS` uncommitted tokens still end in U+FFFD, the window
    is cut `TAIL_TOKENS` before its end (`_cut`): the text up to the cut that the whole window's text
    begins with is committed, replacement characters and all. An incomplete character has at most 3
    bytes and a token at least one, so the bytes a later token could still complete lie after the cut,
    and a character the cut splits (complete in the window) is left uncommitted (`held`): valid UTF-8
    comes out exactly as decode(all ids)."""

    decode: Callable[[list[int]], str]
    surr: int = 0
    read: int = 0
    held: str = ""  # the end of decode(ids[surr:read]) not committed: a character a cut split
    pending: str = ""  # sent, not committed: the complete prefix of the uncommitted window's text

    def push(self, ids: list[int], final: bool) -> str:
        surr_text = self.decode(ids[self.surr:self.read])
        if not surr_text.endswith(self.held):
            raise StitchError("the held text of a cut is not where it was")
        start = len(surr_text) - len(self.held)
        new = self.decode(ids[self.surr:])[start:]
        if not new.startswith(self.pending):
            raise StitchError("decoded text is not an extension of what was sent")
        if final or (new and not new.endswith(REPLACEMENT)):
            out = new[len(self.pending):]
            self.surr, self.read, self.held, self.pending = self.read, len(ids), "", ""
            return out
        if len(ids) - self.read >= HOLD_TOKENS:
            return self._cut(ids, start, new)
        out = new[len(self.pending):].rstrip(REPLACEMENT)  # an incomplete character: wait for its bytes
        self.pending += out
        return out

    def _cut(self, ids: list[int], start: int, new: str) -> str:
        """Commit the window up to its last `TAIL_TOKENS` tokens (of the text up to there, what the
        window's text begins with); send that and the complete prefix of the rest."""
        cut = len(ids) - TAIL_TOKENS
        text = self.decode(ids[self.surr:cut])[start:]
        common = len(os.path.commonprefix([text, new]))
        sent = max(common, len(new.rstrip(REPLACEMENT)))  # >= len(pending): it ends in a complete character
        out = new[len(self.pending):sent]
        self.surr, self.read, self.held, self.pending = self.read, cut, text[common:], new[common:sent]
        return out


@dataclass
class Stitcher:
    decode: Callable[[list[int]], str]
    # the tokens whose text ends the client's at a finish (`request_text.RequestText.text_ids`: without a
    # matched stop token); None: all of them
    text_ids: Callable[[list[int], dict], list[int]] | None = None
    ids: list[int] = field(default_factory=list)
    handoff_tokens: int | None = None
    handoff_mode: str | None = None  # one-shot or catch-up, as the relay reported it
    finish_reason: dict | None = None
    source: str = "relay"  # which stream feeds the client now
    offset: int = 0  # tokens sent before the copy feeding the client now (a migrated copy's prefix)
    ended_here: bool = False  # the router ended the stream itself (`end`), not a server's finish
    _main_checked: bool = False
    _text: IncrementalText | None = None

    def __post_init__(self) -> None:
        self._text = IncrementalText(self.decode)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def feed_relay(self, output_ids: list[int], finish_reason: dict | None) -> Delta:
        if self.source != "relay":
            raise StitchError("relay output after the handoff")
        handoff = HandoffFinish.from_finish(finish_reason)  # a malformed one raises (a ValueError)
        if handoff is not None:
            if handoff.handoff_tokens != len(output_ids):
                raise StitchError(f"relay handed off {handoff.handoff_tokens} tokens but streamed {len(output_ids)}")
            self.handoff_tokens, self.source = handoff.handoff_tokens, "main"
            self.handoff_mode = handoff.mode
            return self._advance(output_ids, None)
        return self._advance(output_ids, finish_reason)

    def feed_main(self, output_ids: list[int], finish_reason: dict | None) -> Delta:
        """MD's cumulative output. Before the handoff (direct P->MD pipeline) it is the only source."""
        if self.source == "relay" and self.handoff_tokens is None:
            raise StitchError("main output before the relay handed off")
        self._check_eager(output_ids)
        return self._advance(output_ids, finish_reason)

    def end(self, finish_reason: dict, output_ids: list[int] | None = None) -> Delta:
        """The router ends the client's stream itself, after the tokens it has or, given the feeding
        copy's `output_ids`, after those (a stop string it found: `stop_watch`): the last delta."""
        if output_ids is None:
            output_ids = self.ids[self.offset:]
        elif self.source == "main":
            self._check_eager(output_ids)
        self.ended_here = True
        return self._advance(output_ids, finish_reason)

    def _check_eager(self, output_ids: list[int]) -> None:
        if not self._main_checked and self.handoff_tokens:  # once: MD's first chunk repeats t1..tk
            if output_ids[: self.handoff_tokens] != self.ids[self.offset: self.offset + self.handoff_tokens]:
                raise StitchError("main's eager tokens differ from what the relay streamed")
            self._main_checked = True

    def resume(self, relayed: bool = False) -> None:
        """A migrated copy feeds the client from here on; its outputs (both feeds take them) follow the
        tokens already sent. Not `relayed` (P->MD, or a relay alone): through `feed_main`. `relayed`
        (P->RLD->MD): through `feed_relay` until the new relay hands off, then `feed_main`, as a first
        copy does (`handoff_tokens` is then the new copy's)."""
        self.offset = len(self.ids)
        if relayed:
            self.source, self.handoff_tokens, self.handoff_mode, self._main_checked = "relay", None, None, False
        else:
            self.source, self._main_checked = "main", True

    def direct(self) -> "Stitcher":
        """Use for the P->MD pipeline: MD is the only source from the start."""
        self.source, self.handoff_tokens = "main", 0
        return self

    def _advance(self, output_ids: list[int], finish_reason: dict | None) -> Delta:
        have = len(self.ids) - self.offset  # of this copy's output, what the client has
        if len(output_ids) < have:
            raise StitchError(f"stream went back from {len(self.ids)} to {self.offset + len(output_ids)} tokens")
        new = [int(t) for t in output_ids[have:]]
        self.ids.extend(new)
        final = finish_reason is not None
        ids = self.text_ids(self.ids, finish_reason) if final and new and self.text_ids else self.ids
        text = self._text.push(ids, final) if new or final else ""
        if final:
            self.finish_reason = finish_reason
        return Delta(new, text, finish_reason)
