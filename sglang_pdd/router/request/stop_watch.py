"""A stop string that straddles a migration: the client's text before the boundary ends with its
first part, and the resumed copy's first tokens complete it.

sglang on the resumed server matches stop strings against its own output only (the tokens the client
already had are its prompt), so it never fires on such a string. The router does: after each
migration (`arm`) it checks the stitched text (the end of the client's text, then the resumed copy's
tokens one at a time) for the client's stop strings, and names the first token that completes one
(`first_stop`); the dispatcher then ends the request there itself (finish `stop`, `matched` the
string, as sglang reports one) and aborts the copies still running. Only a match that ends after
the boundary counts (one wholly before it is the client's past); one wholly after it is the resumed
server's own, and ending there too is the same result. Once the resumed copy's text is as long as
the longest stop string, no match can straddle the boundary any more and the watch stops: it costs a
few decodes of a short window per migration, nothing on a request that never migrated.
"""

from __future__ import annotations

from typing import Callable

from sglang_pdd.router.request.stitch import REPLACEMENT


class StopWatch:
    def __init__(self, stops, decode: Callable[[list[int]], str]):
        stops = [stops] if isinstance(stops, str) else (stops or [])
        self.stops = [s for s in stops if isinstance(s, str) and s]
        self.decode = decode
        self.longest = max(map(len, self.stops), default=0)  # characters
        # tokens past the boundary to look at: a character is at most 4 byte-level tokens
        self.max_tokens = 4 * self.longest + 8
        self._start = 0  # where the decoded window starts in the client's tokens
        self._boundary_chars = 0  # the window's text before the boundary (complete characters)
        self._left = 0  # tokens past the boundary still to look at (0: not watching)

    @property
    def watching(self) -> bool:
        return self._left > 0

    def arm(self, ids: list[int]) -> None:
        """A migrated copy goes on after the client's tokens `ids`."""
        self._left = 0
        if not self.stops or not ids:
            return
        back = self.longest + 1
        while True:  # enough of the client's text that a stop string may start in it
            start = max(0, len(ids) - back)
            before = self.decode(ids[start:]).rstrip(REPLACEMENT)
            if start == 0 or len(before) > self.longest:
                break
            back *= 2
        self._start, self._boundary_chars, self._left = start, len(before), self.max_tokens

    def first_stop(self, ids: list[int], new: list[int]) -> tuple[int, str] | None:
        """`new`: the resumed copy's tokens after the client's `ids`. (How many of them up to the one
        that completes a stop string ending past the boundary, that string), or None."""
        if not self._left or not new:
            return None
        window = ids[self._start:]
        b = self._boundary_chars
        for i, t in enumerate(new):
            window.append(t)
            text = self.decode(window)
            for s in self.stops:
                if text.find(s, max(0, b - len(s) + 1)) != -1:
                    self._left = 0
                    return i + 1, s
            self._left -= 1
            if len(text.rstrip(REPLACEMENT)) >= b + self.longest:
                self._left = 0
            if not self._left:
                return None
        return None
