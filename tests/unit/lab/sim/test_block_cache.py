"""The simulator's block-level LRU radix cache (sim/block_cache.py) against a brute-force
reference, and the cluster's use of it on block-level (Mooncake) requests."""

import math
import random
from dataclasses import replace

import pytest

from sglang_pdd.lab.sim.block_cache import BlockRadixCache
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.presets import TINY_MODEL, tiny_system
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.workload.mooncake import block_segment
from sglang_pdd.lab.workload.request import WorkloadRequest


class RefCache:
    """Brute force: the set of cached prefixes (tuples of block ids) with their tokens and last
    access; hit = walk the prefixes; evict the least recently used prefix no other extends."""

    def __init__(self, capacity):
        self.capacity, self.entries, self.tick = capacity, {}, 0

    def match(self, blocks, lengths, touch=True):
        hit, path = 0, []
        for i, n in enumerate(lengths):
            e = self.entries.get(tuple(blocks[: i + 1]))
            if e is None:
                break
            m = min(e[0], n)
            hit += m
            path.append(tuple(blocks[: i + 1]))
            if m < n:
                break
        if touch and path:
            self.tick += 1
            for p in path:
                self.entries[p][1] = self.tick
        return hit

    def insert(self, blocks, lengths):
        self.tick += 1
        for i, n in enumerate(lengths):
            p = tuple(blocks[: i + 1])
            e = self.entries.setdefault(p, [0, 0])
            e[0], e[1] = max(e[0], n), self.tick
        while sum(e[0] for e in self.entries.values()) > self.capacity:
            leaves = [p for p in self.entries
                      if not any(len(q) == len(p) + 1 and q[: len(p)] == p for q in self.entries)]
            del self.entries[min(leaves, key=lambda p: self.entries[p][1])]

    @property
    def tokens(self):
        return sum(e[0] for e in self.entries.values())


def _paths(c: BlockRadixCache) -> dict:
    out, stack = {}, [((), c.root)]
    while stack:
        path, node = stack.pop()
        for b, ch in node.children.items():
            out[path + (b,)] = ch.tokens
            stack.append((path + (b,), ch))
    return out


def _random_prompt(rng, bt):
    """Prompts from a small tree of shared prefixes, with a partial last block most of the time."""
    k = rng.randint(1, 6)
    head = rng.choice([[], [1], [1, 2], [1, 2, 3], [7], [7, 8]])
    blocks = (head + [rng.randint(10, 40) for _ in range(k)])[: max(1, len(head) + k - 1)]
    last = rng.randint(1, bt) if rng.random() < 0.7 else bt
    return blocks, [bt] * (len(blocks) - 1) + [last]


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_reference(seed):
    rng = random.Random(seed)
    bt = rng.choice([4, 8, 16])
    cap = rng.choice([bt * 3, bt * 7, bt * 20, math.inf])
    c, ref = BlockRadixCache(cap), RefCache(cap)
    evictions_seen = 0
    for step in range(300):
        blocks, lengths = _random_prompt(rng, bt)
        op = rng.random()
        if op < 0.2:
            assert c.match(blocks, lengths, touch=False) == ref.match(blocks, lengths, touch=False)
        elif op < 0.5:
            assert c.match(blocks, lengths) == ref.match(blocks, lengths), step
        else:
            assert c.match(blocks, lengths) == ref.match(blocks, lengths), step
            c.insert(blocks, lengths)
            ref.insert(blocks, lengths)
        assert c.tokens == ref.tokens <= cap
        assert _paths(c) == {p: e[0] for p, e in ref.entries.items()}, step
        evictions_seen = c.evicted_blocks
    if cap != math.inf:
        assert evictions_seen > 0  # the case exercised eviction


def test_partial_last_block_is_a_prefix_of_the_full_block():
    c = BlockRadixCache()
    c.insert([5, 6], [512, 300])
    assert c.match([5, 6], [512, 200]) == 712  # a shorter partial: its own length
    assert c.match([5, 6, 9], [512, 512, 100]) == 812  # full wanted, 300 cached: stops inside
    c.insert([5, 6, 9], [512, 512, 100])  # the longer copy extends the node
    assert c.match([5, 6, 9], [512, 512, 100]) == 1124
    assert c.tokens == 1124


def test_lru_keeps_the_recently_used_prefix():
    c = BlockRadixCache(capacity_tokens=3 * 512)
    c.insert([1, 2], [512, 512])  # a shared system prompt + one turn
    c.insert([3], [512])
    c.match([1, 2], [512, 512])  # [1, 2] used again: [3] is now the least recent
    c.insert([4], [512])
    assert c.match([3], [512], touch=False) == 0
    assert c.match([1, 2], [512, 512], touch=False) == 1024
    c.insert([5, 6], [512, 512])  # evicts leaf 2, then [4]... parent 1 only once childless
    assert c.tokens <= 3 * 512
    assert c.match([5, 6], [512, 512], touch=False) == 1024


def test_peek_does_not_refresh():
    c = BlockRadixCache(capacity_tokens=2 * 512)
    c.insert([1], [512])
    c.insert([2], [512])
    c.match([1], [512], touch=False)  # the router looking does not make [1] recent
    c.insert([3], [512])
    assert c.match([1], [512], touch=False) == 0
    assert c.match([2], [512], touch=False) == 512


def _block_req(i, session, blocks, inp, out=4, t=0.0, bt=64):
    lengths = [bt] * (len(blocks) - 1) + [inp - bt * (len(blocks) - 1)]
    return WorkloadRequest(f"r{i}", session, 0, 1, t, inp, 0, out,
                           segments=tuple(block_segment(b, n) for b, n in zip(blocks, lengths)),
                           block_ids=tuple(blocks), block_tokens=bt)


def test_request_level_caps_the_hit_and_caches_outputs_apart():
    c = BlockRadixCache()
    w = _block_req(0, 0, [1, 2], 100)
    c.insert_finished(w)
    assert c.tokens == 100 + 4  # prompt + an output block
    assert c.hit_req(w) == 99  # at least one token is computed
    assert c.hit_req(_block_req(1, 1, [1, 2, 3], 150)) == 100  # the output never hits


SLA = Sla(ttft_s=5.0, tpot_s=0.2)


def test_cluster_shares_blocks_across_sessions():
    """The point of block-level caches: a prefix shared by *other* sessions hits at P and MD,
    which the per-session DRC of generated workloads can never do."""
    system = list(range(100, 120))  # a 20-block shared prompt
    reqs = [_block_req(i, i, system + [1000 + i], 20 * 64 + 30, t=2.0 * i) for i in range(6)]
    res = run(tiny_system("xdc-pd-drc"), TINY_MODEL, reqs, SLA, 15.0, drain_s=300.0)
    recs = sorted(res.records, key=lambda r: r.arrival_s)
    assert all(r.finished for r in recs)
    assert recs[0].md_hit == 0 and recs[0].prefix_hit_len == 0
    assert all(r.prefix_hit_len == 20 * 64 for r in recs[1:])  # P: cache-aware choice
    assert all(r.md_hit == 20 * 64 for r in recs[1:])  # MD: the router picks the MD holding it
    assert all(r.wan_bytes == (r.input_len - r.md_hit) * TINY_MODEL.kv_bytes_per_token for r in recs)
    # negative control: the same prompts as per-session segments (no block ids) never hit at MD
    plain = [replace(w, block_ids=(), block_tokens=0) for w in reqs]
    res = run(tiny_system("xdc-pd-drc"), TINY_MODEL, plain, SLA, 15.0, drain_s=300.0)
    assert all(r.md_hit == 0 for r in res.records)


def test_cluster_md_cache_is_bounded():
    bt = 64
    reqs = [_block_req(i, i, [10 * i + j for j in range(8)], 8 * bt, t=1.0 * i) for i in range(6)]
    reqs += [_block_req(6 + i, 6 + i, [10 * i + j for j in range(8)], 8 * bt, t=10.0 + i)
             for i in range(6)]  # the same prompts again
    big = run(tiny_system("xdc-pd-drc"), TINY_MODEL, reqs, SLA, 20.0).records
    small_spec = tiny_system("xdc-pd-drc")
    small = run(replace(small_spec, drc_capacity_tokens=10 * bt), TINY_MODEL, reqs, SLA, 20.0).records
    again = lambda recs: [r.md_hit for r in recs if int(r.request_id[1:]) >= 6]
    assert min(again(big)) == 8 * bt - 1
    assert max(again(small)) < 8 * bt - 1
