"""Seeded sampling that survives the handoff: which process samples a token does not matter.

A relayed request is sampled by three servers: P samples t1, RLD t2..tk, MD t(k+1).. (in an EXTEND
over t1..tk, where a single server would decode). sglang's default sampler draws from the process's
torch RNG, so no two servers agree. sglang also has a position-hashed sampler: with a per-request
`sampling_seed`, token i is drawn by Gumbel-max over murmur3(seed, position, token id), the same on
any server and in a decode step or at the last position of an EXTEND (`ModelRunner.sample` passes the
sequence position in both). It is used only under `--enable-deterministic-inference`, which refuses
the CPU attention backend. With `--pdd-seeded-sampling` (on for every PDD role by default) the plugin
gives every sampling batch the seed tensor that mode would give it: a request's `sampling_seed`, and
for a request without one a seed drawn from its rid (each request samples independently, as before).
Greedy requests are unaffected (argmax).
"""

from __future__ import annotations

import zlib

SEED_MASK = (1 << 63) - 1


def request_seed(req) -> int:
    seed = getattr(req.sampling_params, "sampling_seed", None)
    if seed is not None:
        return int(seed) & SEED_MASK
    rid = str(req.rid).encode()
    return (zlib.crc32(rid) | (zlib.adler32(rid) << 32)) & SEED_MASK  # an int64, as the seed tensor is


def attach_seeds(info, reqs, device) -> None:
    """Give `info` (a SamplingBatchInfo of `reqs`) its per-request seeds, unless it has them."""
    import torch

    if getattr(info, "sampling_seed", None) is None:
        info.sampling_seed = torch.tensor([request_seed(r) for r in reqs], dtype=torch.int64, device=device)
