"""The simulator's models from a config (MLA vs MHA-family KV) and the kv-format scenario's bathtub."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_pdd.lab.sim.bathtub import run_bathtub
from sglang_pdd.lab.sim.cli import main
from sglang_pdd.lab.sim.cost_model import CostModel
from sglang_pdd.lab.sim.hardware import CHIP_B, InstanceSpec
from sglang_pdd.lab.sim.kv_format import LENGTH, OUT, instance_chips, setting_for, wan_wall
from sglang_pdd.lab.sim.model import DEEPSEEK_V3, DEEPSEEK_V3_CONFIG, MODELS, PAPER_MOE, V3_SIZE_GQA8, from_hf_config
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs


def test_deepseek_v3_kv_is_one_latent_and_rope_row_per_layer_as_sglang_stores_it():
    assert DEEPSEEK_V3.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert V3_SIZE_GQA8.kv_bytes_per_token == 61 * 2 * 8 * 128 * 2
    assert (DEEPSEEK_V3.experts, DEEPSEEK_V3.top_k) == (256, 8)


def test_the_gqa_twin_differs_only_in_its_kv():
    fields = {k for k, v in vars(DEEPSEEK_V3).items() if vars(V3_SIZE_GQA8)[k] != v}
    assert fields == {"name", "kv_bytes_per_token"}


def test_an_mla_config_counts_prefill_attention_in_its_decompressed_head_dims():
    m = from_hf_config("x", DEEPSEEK_V3_CONFIG, total_params=671e9, active_params=37e9, expert_params=654e9)
    assert m.attn_flops_per_pair == 2 * 61 * 128 * (128 + 64 + 128)  # QK over 192, PV over 128


def test_a_671b_model_gets_16_chip_instances_the_paper_model_8():
    s = PaperSetting()
    assert instance_chips(PAPER_MOE, s) == 8
    assert instance_chips(DEEPSEEK_V3, s) == 16
    st = setting_for(s, DEEPSEEK_V3)
    assert (st.instance_chips, st.baseline_chips, st.pdd_rld_chips) == (16, 176, 16)
    assert {sp.prefill.chips_per_instance for sp in pdd_specs(st)} == {16}
    assert setting_for(s, PAPER_MOE) == s


def test_mla_holds_more_requests_per_decode_instance():
    mla, gqa = (CostModel(m, InstanceSpec(CHIP_B, 16)) for m in (DEEPSEEK_V3, V3_SIZE_GQA8))
    assert mla.kv_capacity_tokens == pytest.approx(gqa.kv_capacity_tokens * 249_856 / 70_272, rel=1e-3)


def test_the_wan_wall_moves_left_with_the_smaller_kv():
    s, hits = PaperSetting(), np.round(np.arange(0.0, 1.0, 0.1), 2)
    walls = {}
    for m in (V3_SIZE_GQA8, DEEPSEEK_V3):
        st = setting_for(s, m)
        walls[m.name] = wan_wall(run_bathtub(st, hits=hits, length=LENGTH, out=OUT))
    assert walls["v3-size-gqa8"] is None  # the GQA pool's misses cap cross-DC PD at every hit below 1
    assert walls["deepseek-v3"] is not None and walls["deepseek-v3"] < 1.0


def test_the_cli_takes_a_model_by_name_and_refuses_an_unknown_one(capsys):
    assert "deepseek-v3" in MODELS
    with pytest.raises(SystemExit):
        main(["--scenario", "kv-format", "--models", "deepseek-v3,no-such-model"])
    assert "no-such-model" in capsys.readouterr().err
