"""The handoff microbenchmark's pure parts: statistics, payload accounting, room coding, slices, table."""

import statistics

import pytest
import torch

from sglang_pdd.lab.micro import handoff_micro as hm
from sglang_pdd.lab.micro.handoff_peers import PATHS, Setup, paged_slices, path_of, room_for
from sglang_pdd.protocol import messages
from sglang_pdd.protocol.auth import MAC_LEN, FrameAuth

SETUP = Setup(tokens=100, prefix_tokens=2000, pool_slots=1024, seed=0, layers=4, kv_heads=8, head_dim=64, vocab=2048)


def test_latency_stats_in_ms_with_sample_std():
    s = hm.LatencyStats.of([0.010, 0.020, 0.030, 0.100])
    assert (s.n, s.min_ms, s.max_ms) == (4, 10.0, 100.0)
    assert s.mean_ms == pytest.approx(40.0)
    assert s.p50_ms == pytest.approx(25.0)
    assert s.std_ms == pytest.approx(statistics.stdev([10.0, 20.0, 30.0, 100.0]))


def test_latency_stats_of_one_round_has_zero_std_and_of_none_fails():
    assert hm.LatencyStats.of([0.5]).std_ms == 0.0
    with pytest.raises(ValueError):
        hm.LatencyStats.of([])


def test_tokens_frame_bytes_is_what_the_channel_seals():
    ids = SETUP.eager_ids()
    sealed = FrameAuth(b"k").seal(messages.encode(messages.Tokens(room=7, ids=ids)))
    assert hm.tokens_frame_bytes(ids, 7) == len(sealed)
    assert hm.ready_frame_bytes(7) == len(FrameAuth(b"k").seal(messages.encode(messages.Ready(room=7))))


def test_token_frame_grows_with_id_width_not_with_kv_geometry():
    small = hm.tokens_frame_bytes([5] * 100, 1)     # msgpack fixint: 1 byte per id
    wide = hm.tokens_frame_bytes([70000] * 100, 1)  # uint32: 5 bytes per id
    assert wide - small == 400
    assert small < MAC_LEN + 200


def test_kv_bytes_is_layers_k_v_tokens_heads_dim_fp32():
    assert hm.kv_bytes(SETUP) == 4 * 2 * 100 * 8 * 64 * 4 == 100 * 16 * 1024


def test_payload_per_path():
    ids = SETUP.eager_ids()
    frame = hm.tokens_frame_bytes(ids, 3)
    ready = hm.ready_frame_bytes(3)
    assert hm.payload_bytes("ids", SETUP, ids, 3, packed_bytes=0) == {"A->B": frame, "B->A": ready}
    assert hm.payload_bytes("kv_paged", SETUP, ids, 3, packed_bytes=0)["A->B"] == hm.kv_bytes(SETUP) + frame
    assert hm.payload_bytes("kv_packed", SETUP, ids, 3, packed_bytes=1_638_416)["A->B"] == 1_638_416 + frame


def test_wire_bytes_per_handoff_are_counter_deltas_over_handoffs():
    before, after = {"A->B": 1000, "B->A": 50}, {"A->B": 1000 + 30 * 445, "B->A": 50 + 30 * 140}
    assert hm.wire_bytes_per_handoff(before, after, 30) == {"A->B": 445.0, "B->A": 140.0}
    with pytest.raises(ValueError):
        hm.wire_bytes_per_handoff(before, after, 0)


def test_rooms_encode_the_path_and_never_collide():
    rooms = {room_for(seq, p) for seq in range(50) for p in PATHS}
    assert len(rooms) == 50 * len(PATHS)
    assert all(path_of(room_for(seq, p)) == p for seq in range(50) for p in PATHS)


def test_paged_slices_one_per_buffer_and_token_at_each_sides_slot():
    srcs, dsts, lens = paged_slices(1000, 50_000, buffer_bytes=4096, buffers=2, src_slots=[3, 1], dst_slots=[0, 2],
                                    slot_bytes=16)
    assert lens == [16] * 4
    assert srcs == [1000 + 48, 1000 + 16, 1000 + 4096 + 48, 1000 + 4096 + 16]
    assert dsts == [50_000, 50_000 + 32, 50_000 + 4096, 50_000 + 4096 + 32]


def test_setup_is_deterministic_and_slots_scattered_distinct():
    assert SETUP.eager_ids() == SETUP.eager_ids()
    assert all(16 <= t < SETUP.vocab for t in SETUP.eager_ids())
    rld, md = SETUP.slots("rld"), SETUP.slots("md")
    assert len(set(rld.tolist())) == len(rld) == 100 and rld.max() < SETUP.pool_slots
    assert rld.tolist() != md.tolist()


def test_summarize_merges_rld_timings_only_when_every_round_has_them():
    rounds = [{"room": r, "transfer_s": 0.04, "local_s": 0.03, "total_s": 0.07} for r in (2, 5)]
    out = hm.summarize(rounds, {"2": {"pack_s": 0.001, "write_s": 0.1}, "5": {"write_s": 0.2}})
    assert out["total_s"]["mean_ms"] == pytest.approx(70.0)
    assert out["write_s"]["max_ms"] == pytest.approx(200.0)
    assert "pack_s" not in out


def test_ratio():
    assert hm.ratio(1.0, 4.0) == 0.25
    assert hm.ratio(1.0, 0.0) is None


def _report():
    stats = {k: hm.asdict(hm.LatencyStats.of([0.05, 0.06])) for k in ("transfer_s", "local_s", "total_s")}
    path = {"payload_bytes": {"A->B": 370, "B->A": 60},
            "wire_bytes_per_handoff": {"A->B": 445.0, "B->A": 150.0},
            "stats": stats, "vs_kv_packed": {"payload": 0.001, "mean": 0.3, "p50": 0.3, "max": 0.3, "std": None}}
    ref = {k: v for k, v in path.items() if k != "vs_kv_packed"}
    return {"setup": hm.asdict(SETUP), "link": {"delay_ms": 20, "jitter_ms": 5, "rate_mbit": 100},
            "model_layers": 4, "rounds": 2, "warmup": 1,
            "md": {"recompute_engine": "x", "recompute_check_max_abs_logit": 0.0},
            "scenarios": {"plain": {"bulk_flow": {}, "ids": path, "kv_packed": ref},
                          "bulk": {"bulk_flow": {"mbit": 60.0}, "ids": path, "kv_packed": ref}}}


def test_format_report_has_a_row_per_path_and_component_and_the_paper_line():
    text = hm.format_report(_report())
    assert "token IDs total" in text and "KV packed total" in text
    assert "recompute (1 extend)" in text and "16 KiB/token" in text
    assert "1 TCP flow(s), 60.0 Mbit/s" in text
    assert "0.001 / 0.3 / 0.3 / -" in text
    assert "4649 KB" in text


def test_csv_option_rejects_unknown_names():
    parse = hm._csv(PATHS)
    assert parse("ids,kv_packed") == ["ids", "kv_packed"]
    with pytest.raises(Exception):
        parse("ids,rdma")


def test_unknown_recompute_engine_is_refused():
    from sglang_pdd.lab.micro.handoff_recompute import make_recompute

    with pytest.raises(ValueError):
        make_recompute("vllm", "unused", [1, 2], 1)


def test_transformers_recompute_extends_over_the_cached_prefix_and_rewinds(tiny_model):
    from sglang_pdd.lab.micro.handoff_recompute import TransformersRecompute

    setup = Setup(tokens=8, prefix_tokens=64, pool_slots=64, seed=1, layers=4, kv_heads=8, head_dim=64, vocab=2048)
    rc = TransformersRecompute(tiny_model, setup.prefix_ids(), setup.tokens)
    # The context model's logits are ~87 in magnitude: fp32 reassociation (the kernels a CPU picks, its
    # thread count) moves them by up to ~2e-4 (seen on CI), a wrong KV by whole units.
    assert rc.check(setup.eager_ids()) < 1e-3
    rc.prepare()
    first = rc(setup.eager_ids())
    rc.prepare()
    again = rc(setup.eager_ids())
    rc.prepare()
    other = rc(list(reversed(setup.eager_ids())))
    assert torch.equal(first, again)       # prepare() rewound: the same KV slots were overwritten
    assert not torch.equal(first, other)   # and the output depends on the handed-over IDs
