"""KV rows a P that relays keeps past a request's end, until the request's KV transfer to MD is over.

A request P relays can end (a handoff, EOS, its length, an abort) while its KV still crosses the WAN:
Mooncake reads the pages P's sender captured when the prefill finished, so those pages must stay the
request's until the sender reports success or failure. sglang frees a finished request's row in
`release_kv_cache`, which first offers the row to the tree cache (`claim_kv_row`: how a streaming session
keeps a row for its next turn). `HeldRows` wraps that one method of P's tree cache, once, when the relay
starts: a request whose transfer is pending (`pending(rid)`, the relay's table of transfers) gives its KV
record to `HeldRows` (sglang's `Req.detach_kv`) and sglang releases nothing; once the transfer is over,
`release(req)` gives the record back and releases it as sglang would have.
"""

from __future__ import annotations

from typing import Any, Callable


class HeldRows:
    def __init__(self, tree_cache: Any, pending: Callable[[str], bool]) -> None:
        """`pending(rid)`: the request's KV transfer is not over (its row must not be freed yet)."""
        self.tree_cache = tree_cache
        self.held: dict[str, tuple[Any, Any]] = {}  # rid -> (req, its detached KV record)
        claim = tree_cache.claim_kv_row

        def claim_kv_row(req: Any) -> bool:
            if pending(req.rid) and req.rid not in self.held:
                self.held[req.rid] = (req, req.detach_kv())
                return True
            return claim(req)

        tree_cache.claim_kv_row = claim_kv_row

    def release(self, req: Any) -> bool:
        """The request's transfer ended: its row, if held, is released now. True when one was."""
        entry = self.held.pop(req.rid, None)
        if entry is None:
            return False
        from sglang.srt.mem_cache.common import release_kv_cache

        held_req, kv = entry
        held_req.kv = kv
        release_kv_cache(held_req, self.tree_cache, checkpoint=False)
        return True

    def __len__(self) -> int:
        return len(self.held)
