"""The health checker's probe: does an ejected peer serve a request, not merely run?

sglang's `/health` answers 200 whenever the server process runs (its `/health_generate` whenever the
scheduler sent anything lately, even the end of a failed request), so neither says a peer that failed
every request now serves one. The probe is a real one-token generate, on a fixed short prompt of
token IDs, asked the way the router asks that role (`Dispatcher._run`): P's non-streamed reply,
RLD's and MD's stream up to its finish. A prefill-mode or decode-mode server cannot serve a lone
generate with a real KV transfer, so the probe carries sglang's fake bootstrap host, as sglang's own
`/health_generate` and warm-up do in PD modes: P prefills and sends its KV nowhere, RLD and MD take a
synthesized KV and decode one token. It is served when the reply (P) or the stream (RLD, MD) ends
with a finish that is not an abort; anything else (an HTTP error, an error in the stream, an abort,
a broken stream, no answer within the timeout) and the peer stays out. A probe that failed is
aborted on the peer (best effort), so that a hung one does not keep a slot.

What the probe cannot see: a peer whose real KV transfers fail (its fake one passes) comes back and
fails again; its probation (`peers.health`) then takes it out for twice as long each time.
"""

from __future__ import annotations

import secrets

import aiohttp

from sglang_pdd.router.peers import upstream

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang's marker (disaggregation.utils): no real KV transfer
PROBE_IDS = (10, 11, 12, 13)  # sglang's own warm-up prompt: valid for any vocabulary


def probe_body(rid: str) -> dict:
    return {"rid": rid, "input_ids": list(PROBE_IDS),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": secrets.randbits(63)}


async def probe(session: aiohttp.ClientSession, role: str, url: str, timeout_s: float) -> str | None:
    """None when the peer served the probe; else what went wrong (for the log)."""
    rid = f"pdd-probe-{secrets.token_hex(8)}"
    body = probe_body(rid)
    try:
        if role == "prefill":
            await upstream.post_json(session, role, url, "/generate", body, timeout_s)
        else:
            async for _ in upstream.stream_generate(session, role, url, body, timeout_s):
                pass
    except upstream.UpstreamError as e:
        await upstream.abort(session, url, rid)
        return e.public
    return None
