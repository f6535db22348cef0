"""Seeds drawn from a request's rid fit the int64 tensor sglang's sampler reads (an overflow there
raised inside the sampling hook and took the scheduler down)."""

import uuid
import zlib
from types import SimpleNamespace

import pytest

from sglang_pdd.seeded_sampling import SEED_MASK, attach_seeds, request_seed

torch = pytest.importorskip("torch")


def req(rid, seed=None):
    return SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(sampling_seed=seed))


def test_rid_seeds_fit_int64_for_rids_whose_adler32_has_the_top_bit():
    rids = [uuid.UUID(int=i).hex for i in range(64)] + [uuid.uuid4().hex for _ in range(64)]
    assert any(zlib.adler32(r.encode()) >= 1 << 31 for r in rids)  # the case that overflowed
    reqs = [req(r) for r in rids]
    info = SimpleNamespace(sampling_seed=None)
    attach_seeds(info, reqs, "cpu")
    assert info.sampling_seed.tolist() == [request_seed(r) for r in reqs]
    assert all(0 <= s <= SEED_MASK for s in info.sampling_seed.tolist())


def test_rid_seeds_are_stable_and_distinct_and_a_given_seed_wins():
    assert request_seed(req("abc")) == request_seed(req("abc")) != request_seed(req("abd"))
    assert request_seed(req("abc", seed=7)) == 7
    assert request_seed(req("abc", seed=-1)) == SEED_MASK
