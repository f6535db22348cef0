"""What test_relay_handoff and test_relay_restarts check a relayed request with, on the servers they share
(shared_cluster.OVERLAP): the reference's tokens, one request handed over at exactly k, and its identity."""

from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.pdd_client import relayed_generate

NEW = 64  # output tokens, unless a test says otherwise


def ref(reference_server, ids, n=NEW, **sp) -> identity.Reference:
    return identity.reference(reference_server.url, ids, n, **sp)


def relayed(pdd, body, k: int | None = None, min_k: int = 2, **kw):
    """One relayed request whose handoff happens after exactly `k` eager tokens (MD first, RLD's knob;
    for a catch-up, its first chunk is answered at k and the final step comes later), or, with
    `k=None`, every leg at once and at least `min_k` eager tokens."""
    with pdd.knobs("relay", relay_min_eager=k if k is not None else min_k):
        r = relayed_generate(pdd.roles, body, main_first=k is not None, **kw)
    assert r.handed_over, r.relay["meta_info"]
    catch_up = (kw.get("main_extra") or {}).get("handoff") == "catch-up"
    if k is not None and not catch_up:
        assert r.k == k, f"k={r.k}, not {k}"
    assert r.k >= (k or min_k), f"k={r.k}"
    return r


def assert_identical(want: identity.Reference, r, what: str) -> None:
    """RLD's stream is exactly t1..tk of the reference, MD's output (t1..tk then its own) all of it."""
    identity.check(want, r.relay["output_ids"], f"{what}: RLD's eager tokens (k={r.k})", prefix=True)
    assert len(r.relay["output_ids"]) == r.k
    identity.check(want, r.main["output_ids"], f"{what}: MD after the handoff at k={r.k}")
    assert r.tokens == r.main["output_ids"]
