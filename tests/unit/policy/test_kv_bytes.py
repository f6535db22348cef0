"""The router's KV bytes per token from a model's config.json (policy/kv_bytes.py): MHA/GQA K and V per
KV head and layer, MLA one latent row (kv_lora_rank + qk_rope_head_dim) per layer; the test models'
builders state their own figure, which the config must give."""

import json

import pytest

from sglang_pdd.policy import kv_bytes

DEEPSEEK_V3 = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
               "head_dim": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
               "v_head_dim": 128, "torch_dtype": "bfloat16"}
LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "torch_dtype": "bfloat16"}


def test_mla_is_one_latent_and_rope_row_per_layer():
    assert kv_bytes.per_token(DEEPSEEK_V3) == 61 * (512 + 64) * 2 == 70272


def test_mha_and_gqa_are_k_and_v_per_kv_head():
    assert kv_bytes.per_token(LLAMA_8B) == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes.per_token({**LLAMA_8B, "num_key_value_heads": 32}) == 524288  # MHA


@pytest.mark.parametrize("arch", ["llama", "mla"])
def test_the_test_models_config_gives_the_builders_figure(tmp_path, arch):
    from sglang_pdd.lab.testing import tiny_mla
    from sglang_pdd.lab.testing.tiny_model import TinyModelSpec

    spec = TinyModelSpec(arch=arch)
    if arch == "mla":
        cfg = tiny_mla.config(spec, spec.vocab, 1, 2).to_dict()
    else:
        cfg = {"num_hidden_layers": spec.layers, "hidden_size": spec.hidden, "num_attention_heads": spec.heads,
               "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim, "dtype": spec.dtype}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes.from_config(str(tmp_path)) == spec.kv_bytes_per_token
