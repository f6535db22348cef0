"""HeldRows: a relayed request's row outlives its end while its KV transfer to MD is not over. The tree cache
and requests are stand-ins with sglang's two methods it relies on (claim_kv_row, Req.detach_kv); the real
path is tests/e2e/test_local_relay.py's (P idle after every relay)."""

from types import SimpleNamespace

import pytest

from sglang_pdd.prefill_relay.held_rows import HeldRows


class Req:
    def __init__(self, rid):
        self.rid, self.kv = rid, SimpleNamespace(row=rid)

    def detach_kv(self):
        kv, self.kv = self.kv, SimpleNamespace(row=None)
        return kv


@pytest.fixture
def released(monkeypatch):
    out = []

    def release_kv_cache(req, tree_cache, *, checkpoint):
        out.append((req.rid, req.kv.row, checkpoint))

    import sglang.srt.mem_cache.common as common

    monkeypatch.setattr(common, "release_kv_cache", release_kv_cache)
    return out


def test_a_request_ending_while_its_transfer_runs_keeps_its_row_until_the_transfer_is_over(released):
    tree = SimpleNamespace(claim_kv_row=lambda req: False)
    transfers = {"a"}
    rows = HeldRows(tree, pending=transfers.__contains__)
    a = Req("a")
    assert tree.claim_kv_row(a) is True  # sglang's release_kv_cache then frees nothing
    assert a.kv.row is None and len(rows) == 1
    transfers.discard("a")
    assert rows.release(a) is True
    assert released == [("a", "a", False)] and len(rows) == 0  # the request's own row, released once


def test_other_requests_go_to_the_caches_own_claim(released):
    asked = []
    tree = SimpleNamespace(claim_kv_row=lambda req: asked.append(req.rid) or False)
    transfers = set()
    rows = HeldRows(tree, pending=transfers.__contains__)
    b = Req("b")
    assert tree.claim_kv_row(b) is False and asked == ["b"]
    assert rows.release(b) is False  # its transfer ended before the request did: nothing held
    assert tree.claim_kv_row(b) is False and asked == ["b", "b"]  # its end releases it as sglang would
    assert released == []

