"""How long a role may stay silent on one request, and whether that silence is its peer's fault.

The role's idle deadline (`--{role}-idle-timeout`) is the longest wait for a copy's next chunk. A
client can legitimately make that wait longer, and its request must not then count against a healthy
peer:

* `stream_interval` (sglang sends a chunk every that many tokens after the first) and its stop
  strings (sglang holds a chunk back while the output's tail may begin one, in the ordinary case for
  up to the string's length in UTF-8 bytes, a bound on its tokens): each such token adds
  `--idle-per-token-s` to the request's deadlines (`allowance_s`). The total `--request-timeout`
  still bounds every request.
* Whatever else delays one request's next chunk (a stop string the output keeps half-matching, a
  long constrained-decoding compile, a request stuck in one server) leaves the peer's other requests
  flowing. So an idle deadline counts as the peer's failure only when the peer gave no answer on any
  request while this one waited (`PeerHealth.progress` did not move: `silent`). A stalled peer, or
  the WAN to its site, stalls all its requests and is still ejected; a peer with one slow request is
  not. The request itself still migrates (or fails with its 504): it did stall.
"""

from __future__ import annotations


def extra_tokens(sampling_params: dict) -> int:
    """Tokens a chunk may legitimately wait for beyond the first, by the client's own parameters."""
    interval = sampling_params.get("stream_interval")
    n = int(interval) - 1 if isinstance(interval, int) and not isinstance(interval, bool) and interval > 1 else 0
    stops = sampling_params.get("stop")
    stops = [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else []
    return n + max((len(s.encode("utf-8", "replace")) for s in stops if isinstance(s, str)), default=0)


def allowance_s(per_token_s: float, sampling_params: dict) -> float:
    """What one request's own parameters add to each of its idle deadlines."""
    return per_token_s * extra_tokens(sampling_params)


def silent(progress_then: int, progress_now: int) -> bool:
    """The peer gave no answer on any request between the two readings of its `progress`."""
    return progress_now == progress_then
