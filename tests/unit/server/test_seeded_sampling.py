"""Per-request seeds for sglang's position-hashed sampler: an int64 for every request, explicit seeds kept."""

from types import SimpleNamespace

import torch

from sglang_pdd.server.seeded_sampling import SEED_MASK, attach_seeds, request_seed


def req(rid, seed=None):
    return SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(sampling_seed=seed))


def test_every_rid_gives_an_int64_seed_and_explicit_seeds_win():
    seeds = [request_seed(req(f"{i:032x}")) for i in range(2000)] + [request_seed(req("x" * 200))]
    assert all(0 <= s <= SEED_MASK for s in seeds)
    assert len(set(seeds)) == len(seeds)  # requests sample independently
    assert request_seed(req("a", seed=7)) == request_seed(req("b", seed=7)) == 7
    assert request_seed(req("a", seed=-1)) == SEED_MASK  # masked into int64, as sglang's tensor needs


def test_attach_seeds_builds_the_tensor_and_keeps_one_already_there():
    info = SimpleNamespace(sampling_seed=None)
    attach_seeds(info, [req("r1"), req("r2", seed=3)], "cpu")
    assert info.sampling_seed.dtype == torch.int64 and info.sampling_seed.tolist()[1] == 3
    mine = torch.tensor([1, 2])
    info.sampling_seed = mine
    attach_seeds(info, [req("r1"), req("r2")], "cpu")
    assert info.sampling_seed is mine
