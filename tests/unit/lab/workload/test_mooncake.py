"""Mooncake-format traces (workload/mooncake.py) and their replay (`--scenario trace`)."""

import json
import math
from pathlib import Path

import pytest

from sglang_pdd.lab.sim.block_cache import BlockRadixCache
from sglang_pdd.lab.sim.cli import main
from sglang_pdd.lab.workload.generator import generate
from sglang_pdd.lab.sim.presets import tiny_workload
from sglang_pdd.lab.workload.mooncake import (MooncakeOptions, hit_histogram, read_mooncake,
                                              token_ids_for_blocks)
from sglang_pdd.lab.workload.trace import is_mooncake_file, read_jsonl, write_jsonl

SHARED = Path(__file__).resolve().parents[4] / "sglang_pdd" / "lab" / "workload" / "traces" / "mooncake-synthetic.jsonl.xz"


def _write(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _small(tmp_path, n=40):
    """A session-less trace: a shared 8-block system prompt, then per request 2-5 own blocks;
    every third request re-sends a previous request's whole prompt plus one block."""
    recs, prompts, nxt = [], [], 1000
    for i in range(n):
        if i % 3 == 2:
            ids = prompts[i - 1] + [nxt]
            nxt += 1
        else:
            own = 2 + i % 4
            ids = list(range(8)) + list(range(nxt, nxt + own))
            nxt += own
        prompts.append(ids)
        inp = 512 * (len(ids) - 1) + 1 + (37 * i) % 512
        recs.append({"timestamp": 250 * i, "input_length": inp, "output_length": 20 + i,
                     "hash_ids": ids})
    return _write(tmp_path / "mc.jsonl", recs), recs


def test_token_ids_follow_block_ids():
    a = token_ids_for_blocks([3, 4], 700, 5000)
    b = token_ids_for_blocks([3, 9, 1], 1100, 5000)
    assert len(a) == 700 and len(b) == 1100
    assert a[:512] == b[:512] and a[512:] != b[512:700]  # equal id = equal tokens, across requests
    assert token_ids_for_blocks([4], 100, 5000) == a[512:612]  # a partial block = a prefix
    assert token_ids_for_blocks([3, 4], 700, 5000) == a  # deterministic
    with pytest.raises(ValueError, match="hash_ids has 1"):
        token_ids_for_blocks([3], 700, 5000)


def test_reader_builds_requests_whose_tokens_are_the_blocks(tmp_path):
    path, recs = _small(tmp_path)
    assert is_mooncake_file(path)
    tr = read_mooncake(path)
    assert len(tr.requests) == len(recs)
    for w, r in zip(tr.requests, recs):
        assert w.input_len == r["input_length"] and w.max_output_tokens == r["output_length"]
        assert w.arrival_s == r["timestamp"] / 1000 and list(w.block_ids) == r["hash_ids"]
        assert sum(w.block_lengths()) == w.input_len
        assert w.token_ids(5000) == token_ids_for_blocks(w.block_ids, w.input_len, 5000)
    # the expected (unbounded-cache) hit: request 2 re-sends request 1 whole
    w1, w2 = tr.requests[1], tr.requests[2]
    assert w2.prefix_hit_len == w1.input_len
    assert tr.requests[0].prefix_hit_len == 0 and w1.prefix_hit_len == 8 * 512


def test_options_window_speedup_and_length_scale(tmp_path):
    path, recs = _small(tmp_path)
    tr = read_mooncake(path, MooncakeOptions(start_s=2.0, end_s=6.0, speedup=4.0, length_scale=0.25))
    kept = [r for r in recs if 2000 <= r["timestamp"] < 6000]
    assert len(tr.requests) == len(kept) and tr.outside_window == len(recs) - len(kept)
    assert tr.requests[0].arrival_s == 0.0
    assert tr.requests[-1].arrival_s == pytest.approx((kept[-1]["timestamp"] / 1000 - 2.0) / 4)
    for w, r in zip(tr.requests, kept):
        assert w.block_tokens == 128
        assert w.input_len == pytest.approx(r["input_length"] / 4, abs=2)
        assert w.max_output_tokens == round(r["output_length"] / 4)
    text = tr.describe()
    assert "x4" in text and "x0.25" in text and "block 128 tokens" in text and "2-6 s" in text
    capped = read_mooncake(path, MooncakeOptions(max_context=4000))
    assert capped.too_long == sum(1 for r in recs if r["input_length"] + r["output_length"] > 4000) > 0
    assert "dropped" in capped.describe()
    for bad in (dict(speedup=0), dict(length_scale=1.5), dict(start_s=5, end_s=5)):
        with pytest.raises(ValueError):
            MooncakeOptions(**bad)


def test_malformed_records_are_refused_with_the_line(tmp_path):
    ok = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    bad = dict(ok, hash_ids=[1])
    with pytest.raises(ValueError, match="line 2: input_length 600 needs 2 hash_ids"):
        read_mooncake(_write(tmp_path / "b.jsonl", [ok, bad]))
    with pytest.raises(ValueError, match="line 1: input_length must be > 0"):
        read_mooncake(_write(tmp_path / "c.jsonl", [dict(ok, input_length=0, hash_ids=[])]))


def test_our_jsonl_keeps_working_and_carries_block_ids(tmp_path):
    gen = generate(tiny_workload(duration_s=5.0))
    write_jsonl(gen, tmp_path / "ours.jsonl")
    line = json.loads(open(tmp_path / "ours.jsonl").readline())
    assert "block_ids" not in line  # generated workloads: unchanged format
    assert not is_mooncake_file(tmp_path / "ours.jsonl")
    assert read_jsonl(tmp_path / "ours.jsonl") == gen
    path, _ = _small(tmp_path)
    mc = read_mooncake(path).requests
    write_jsonl(mc, tmp_path / "mc-ours.jsonl")
    back = read_jsonl(tmp_path / "mc-ours.jsonl")
    assert back == mc and back[3].block_ids == mc[3].block_ids


def test_histogram_buckets():
    assert hit_histogram([0.0, 0.1, 0.2, 0.6, 0.94, 0.95, 1.0]) == pytest.approx(
        [2 / 7, 1 / 7, 1 / 7, 1 / 7, 2 / 7])


def test_shared_trace_hit_with_an_unbounded_cache():
    """The README of the shared trace: 65 % of prompt tokens hit with an unbounded cache;
    55 % of requests under 20 % hit, 37 % at 95 % or more."""
    reqs = read_mooncake(SHARED).requests
    assert len(reqs) == 3993
    cache, hit, tokens = BlockRadixCache(math.inf), 0, 0
    for w in reqs:
        h = cache.match(w.block_ids, w.block_lengths())
        assert h == w.prefix_hit_len  # the simulator's cache agrees with the reader's
        cache.insert(w.block_ids, w.block_lengths())
        hit, tokens = hit + h, tokens + w.input_len
    assert hit / tokens == pytest.approx(0.65, abs=0.01)
    hist = hit_histogram([w.prefix_hit_len / w.input_len for w in reqs])
    assert hist[0] == pytest.approx(0.55, abs=0.01) and hist[-1] == pytest.approx(0.37, abs=0.01)


def test_cli_replays_a_mooncake_file(tmp_path, capsys):
    path, _ = _small(tmp_path)
    assert main(["--scenario", "trace", "--trace", path, "--systems", "xdc-pd-drc,pdd-bw",
                 "--no-goodput", "--trace-speedup", "2"]) == 0
    out = capsys.readouterr().out
    assert "40 of 40 Mooncake records" in out and "x2" in out
    assert "pdd-bw" in out and ">=95%" in out
    md_rows = [l for l in out.splitlines() if l.startswith("xdc-pd-drc") and " MD " in l]
    assert md_rows and float(md_rows[0].split()[2]) > 0.3  # shared blocks hit at MD


def test_cli_refuses_mooncake_options_on_our_format(tmp_path):
    write_jsonl(generate(tiny_workload(duration_s=5.0)), tmp_path / "ours.jsonl")
    with pytest.raises(SystemExit, match="Mooncake-format traces only"):
        main(["--scenario", "trace", "--trace", str(tmp_path / "ours.jsonl"), "--no-goodput",
              "--trace-speedup", "2"])
