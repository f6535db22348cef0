"""The stitched PDD stream as sglang's TokenizerManager would have yielded it to its OpenAI layer.

sglang's `OpenAIServingChat` reads, per chunk, a dict `{"text", "output_ids", "meta_info"}` whose text
and ids are cumulative (the router publishes `incremental_streaming_output=False` to sglang's layer,
whatever its roles stream), and whose `meta_info` carries the finish reason, the token counts, the
cached prompt tokens and the output logprobs. `contents` builds those dicts from the dispatcher's
`Delta`s: the text is the stitched text with a matched stop string cut as sglang's detokenizer cuts it
(`shapes.StopTrim`), the logprobs those the roles returned for the client's tokens (the dispatcher's
list, aligned with the stitched ids), `cached_tokens` what the chosen MainDecode already held of the
prompt when the router chose it. A non-streaming request gets one dict, the last.

A failure of the request after it started becomes sglang's own abort chunk (a finish of type `abort`
with the failure's status), which sglang's layer turns into its streaming error; a failure before any
output is raised (`RequestFailed`), for the router to answer with its status.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import AsyncIterator, Callable

from sglang_pdd.router.request.dispatch import Outcome
from sglang_pdd.router.api.openai.shapes import StopTrim
from sglang_pdd.router.request.failure import RequestFailed
from sglang_pdd.router.request.stitch import Delta


WEIGHT_VERSION = "default"  # sglang's default --weight-version (the roles' is not in their stream chunks)


class LiveLogprobs:
    """The client's tokens' logprobs as sglang's two aligned lists (logprob, id, text) and top rows,
    grown by the entries each delta adds: O(1) per token. Intermediate chunks share the live lists, as
    sglang's TokenizerManager shares its own (its layer slices them at the chunk's length at once);
    the last chunk gets copies."""

    def __init__(self) -> None:
        self.tokens: list = []
        self.tops: list = []
        self.has_top = False

    def grow(self, entries: list, n: int) -> None:
        """Take the dispatcher's entries (logprob, id, text[, top row]) up to the client's `n` tokens."""
        for e in entries[len(self.tokens): n]:
            self.tokens.append(tuple(e[:3]))
            self.tops.append(e[3] if len(e) > 3 else None)
            self.has_top = self.has_top or len(e) > 3

    def meta(self, final: bool) -> dict:
        tokens, tops = (list(self.tokens), list(self.tops)) if final else (self.tokens, self.tops)
        return {"output_token_logprobs": tokens, "output_token_logprobs_length": len(tokens),
                "output_top_logprobs": tops if self.has_top else []}


def content(rid: str, ids: list[int], text: str, reason: dict | None, n_prompt: int, outcome: Outcome,
            logprobs: LiveLogprobs | None, final: bool = True) -> dict:
    """One chunk for sglang's layer; `final`: the last (its lists are copies, an intermediate one's
    are the live lists)."""
    meta = {"id": rid, "finish_reason": reason, "prompt_tokens": n_prompt, "completion_tokens": len(ids),
            "cached_tokens": outcome.md_hit or 0, "weight_version": WEIGHT_VERSION}
    if logprobs is not None:
        meta.update(logprobs.meta(final))
    return {"text": text, "output_ids": list(ids) if final else ids, "meta_info": meta}


@dataclass
class FeedState:
    """What the feed saw: the client's tokens, and whether the request failed after it started."""

    tokens: int = 0
    failed: bool = False


async def contents(stream: AsyncIterator[Delta], first: Delta | None, rid: str, n_prompt: int, stops: list[str],
                   outcome: Outcome, logprobs: bool, whole: bool, state: FeedState,
                   on_delta: Callable[[Delta], None] = lambda d: None) -> AsyncIterator[dict]:
    """sglang's chunks for the request; `whole`: only the last (a non-streaming request). `on_delta`:
    called for each delta after the first (the router's first-token clock)."""
    ids: list[int] = []
    trim = StopTrim(stops=list(stops))
    seen, reason = False, None

    async def deltas():
        if first is not None:
            yield first
        async for d in stream:
            on_delta(d)
            yield d

    live = LiveLogprobs() if logprobs else None
    try:
        async for d in deltas():
            ids += d.token_ids
            state.tokens = len(ids)
            trim.push(d.text, d.finish_reason)
            if live is not None:
                live.grow(outcome.live_logprobs or [], len(ids))
            seen, reason = True, d.finish_reason
            if not whole:  # a streamed request: a chunk per delta, sharing the live lists until the last
                yield content(rid, ids, trim.sent, reason, n_prompt, outcome, live, final=reason is not None)
    except RequestFailed as e:
        if whole or not seen:  # nothing streamed yet: the router answers with its status
            raise
        state.failed = True
        status = HTTPStatus(e.status) if e.status in HTTPStatus._value2member_map_ else HTTPStatus.BAD_GATEWAY
        yield content(rid, ids, trim.sent, {"type": "abort", "status_code": status, "message": str(e)},
                      n_prompt, outcome, None)
        return
    if whole and seen:  # a whole request: one chunk, built once
        yield content(rid, ids, trim.sent, reason, n_prompt, outcome, live)
