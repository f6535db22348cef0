"""Invariants of the roofline cost model (sglang_pdd.lab.sim.cost_model)."""

import pytest

from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.hardware import CHIP_A, CHIP_B, Chip, Efficiency, InstanceSpec
from sglang_pdd.lab.sim.model import DENSE_70B, PAPER_MOE, ModelSpec


@pytest.fixture(params=[PAPER_MOE, DENSE_70B], ids=lambda m: m.name)
def cm(request):
    return CostModel(request.param, InstanceSpec(CHIP_A, 8))


def test_decode_step_grows_with_batch_kv_bytes(cm):
    times = [cm.decode_step_s(32, ctx) for ctx in (0, 10_000, 100_000, 1_000_000, 4_000_000)]
    assert all(b > a for a, b in zip(times, times[1:]))


def test_decode_step_grows_with_batch(cm):
    times = [cm.decode_step_s(b, b * 8000) for b in (1, 2, 8, 32, 128)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] > times[0]


def test_decode_throughput_rises_with_batch(cm):
    tput = [b / cm.decode_step_s(b, b * 8000) for b in (1, 8, 64)]
    assert tput[0] < tput[1] < tput[2]


def test_more_memory_bandwidth_means_faster_long_context_decode():
    slow = CostModel(PAPER_MOE, InstanceSpec(CHIP_A, 8))
    fast_chip = Chip("A+bw", CHIP_A.peak_tflops, CHIP_A.mem_gb, CHIP_A.mem_bw_tbps * 2,
                     CHIP_A.interconnect_gbps, 1.0)
    fast = CostModel(PAPER_MOE, InstanceSpec(fast_chip, 8))
    assert fast.decode_step_s(64, 64 * 64_000) < slow.decode_step_s(64, 64 * 64_000)


def test_chip_b_decodes_long_context_faster_and_a_prefills_faster():
    a = CostModel(PAPER_MOE, InstanceSpec(CHIP_A, 8))
    b = CostModel(PAPER_MOE, InstanceSpec(CHIP_B, 8))
    assert b.decode_step_s(100, 100 * 64_000) < a.decode_step_s(100, 100 * 64_000)
    assert a.prefill_request_s(32_000, 0, 8192) < b.prefill_request_s(32_000, 0, 8192)
    assert b.kv_capacity_tokens > a.kv_capacity_tokens


def test_prefill_grows_with_new_tokens_and_with_prefix(cm):
    assert cm.prefill_step_s([Chunk(4096, 0)]) < cm.prefill_step_s([Chunk(8192, 0)])
    assert cm.prefill_step_s([Chunk(4096, 0)]) < cm.prefill_step_s([Chunk(4096, 60_000)])
    total = [cm.prefill_request_s(n, 64_000 - n, 8192) for n in (1000, 8000, 30_000, 64_000)]
    assert all(b > a for a, b in zip(total, total[1:]))


def test_small_chunks_cost_more_per_token_tail_chunk_effect(cm):
    per_tok = [cm.prefill_step_s([Chunk(n, 0)]) / n for n in (64, 512, 2048, 8192)]
    assert all(b < a for a, b in zip(per_tok, per_tok[1:]))
    # one 8192 + a 64-token tail alone costs more than one batched 8256-token step
    alone = cm.prefill_step_s([Chunk(8192, 0)]) + cm.prefill_step_s([Chunk(64, 8192)])
    batched = cm.prefill_step_s([Chunk(8192, 0), Chunk(64, 8192)])
    assert alone > batched


def test_extend_of_few_tokens_costs_about_a_decode_step_not_a_prefill(cm):
    ext = cm.extend_s([Chunk(100, 64_000)])
    assert ext < cm.prefill_request_s(8192, 0, 8192)
    assert ext >= cm.decode_step_s(1, 64_000)


def test_moe_reads_fewer_weights_for_few_tokens():
    m = PAPER_MOE
    assert m.weight_bytes_read(1) < m.weight_bytes_read(16) < m.weight_bytes_read(4096) <= m.weight_bytes
    assert DENSE_70B.weight_bytes_read(1) == DENSE_70B.weight_bytes


def test_kv_capacity_and_fit_check():
    cm = CostModel(PAPER_MOE, InstanceSpec(CHIP_A, 8))
    free = 8 * 96e9 * Efficiency().mem_usable - PAPER_MOE.weight_bytes
    assert cm.kv_capacity_tokens == int(free // PAPER_MOE.kv_bytes_per_token)
    with pytest.raises(ValueError):
        CostModel(PAPER_MOE, InstanceSpec(CHIP_A, 1))  # 230 GB of weights on one 96 GB chip


def test_invalid_specs_rejected():
    with pytest.raises(ValueError):
        ModelSpec("bad", 1, 1, 1, 1, kv_bytes_per_token=10, total_params=1, active_params=2)
    with pytest.raises(ValueError):
        Chip("bad", 0, 1, 1, 1, 1)
