"""One role copy's output so far, whichever way its server streams it.

sglang streams a request's `output_ids` (and `meta_info.output_token_logprobs`) cumulatively by
default, each line repeating the whole output (O(n^2) bytes over a long output), or, on a server
started with `--incremental-streaming-output`, as deltas. The mode is server-wide and not in the
chunk, but `meta_info.completion_tokens` counts the whole output in both: from the first chunk that
follows some output, a delta is the chunk whose ids extend the output to that count. Until then (or
without the count, as from a server that does not send it) chunks are taken as cumulative. Where the
request asked for top logprobs (`top_logprobs_num`), each token's entry carries its row of
`meta_info.output_top_logprobs` as a fourth element.
"""

from __future__ import annotations


class OutputView:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list = []
        self.incremental: bool | None = None  # None: not known yet

    def push(self, chunk: dict) -> tuple[list[int], list]:
        """The cumulative (output ids, output token logprobs) after `chunk`."""
        ids = chunk.get("output_ids") or []
        meta = chunk.get("meta_info") or {}
        got = meta.get("output_token_logprobs") or []
        top = meta.get("output_top_logprobs")
        if got and top:  # asked for top logprobs (OpenAI top_logprobs): one entry per token, the row last
            got = [(*e, row) for e, row in zip(got, top)]
        if self.incremental is None and self.ids:
            n = meta.get("completion_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and n != len(ids):
                self.incremental = len(self.ids) + len(ids) == n or None
        if self.incremental:
            self.ids.extend(ids)
            self.logprobs.extend(got)
        else:  # the chunk's own lists (decoded for this chunk only): no copy per chunk on the hot path
            self.ids = ids
            self.logprobs = got or self.logprobs
        return self.ids, self.logprobs
