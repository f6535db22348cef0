"""How one request's tokens become its text: as sglang's detokenizer makes that request's.

sglang's `DetokenizerManager` decodes each request with the request's own `skip_special_tokens` and
`spaces_between_special_tokens` (sampling parameters: sglang's chat layer turns skipping off when
tools are present, and for the parsers whose markers are special tokens, so that Mistral's
`[TOOL_CALLS]` or harmony's channels reach its tool and reasoning parsers), and at the finish drops
the stop token that ended the request from the text (`trim_matched_stop`), unless `no_stop_trim` or
the token closes a tool call (`kept_stop_ids`: a response-template tool parser's one-token closer,
gpt-oss's `<|call|>`; `router.api.openai.sglang_server` names them for its parser). The router decodes
the stitched tokens itself (`stitch`), so it does the same, per request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

# decode(ids) -> str with sglang's defaults (special tokens skipped, spaces between them); a request that
# keeps them, or drops the spaces, calls it with skip_special_tokens=False / spaces_between_special_tokens=False
# (a tokenizer's decode with skip_special_tokens=True bound)
Decode = Callable[..., str]


@dataclass(frozen=True)
class RequestText:
    decode: Callable[[list[int]], str]  # with the request's options
    trim_stop_token: bool = True  # not no_stop_trim
    kept_stop_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, decode: Decode, sampling_params: dict, kept_stop_ids: frozenset[int] = frozenset()) -> "RequestText":
        """sglang's defaults where the request sets nothing (`SamplingParams`: skip special tokens, spaces
        between them, trim the stop); `decode` is given only the options the request turns off."""
        off = {k: False for k in ("skip_special_tokens", "spaces_between_special_tokens")
               if sampling_params.get(k) is not None and not sampling_params[k]}
        return cls(functools.partial(decode, **off) if off else decode,
                   trim_stop_token=not sampling_params.get("no_stop_trim"), kept_stop_ids=kept_stop_ids)

    def text_ids(self, ids: list[int], finish_reason: dict | None) -> list[int]:
        """The tokens whose text is the request's, given its finish: without the stop token that ended it
        (as sglang, the last token: the one the scheduler matched)."""
        if not ids or not self.trim_stop_token or not finish_reason:
            return ids
        matched = finish_reason.get("matched")
        if not isinstance(matched, int) or isinstance(matched, bool) or ids[-1] in self.kept_stop_ids:
            return ids
        return ids[:-1]
