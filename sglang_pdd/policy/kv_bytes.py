"""KV bytes per token of a model, from its Hugging Face `config.json` (the router's default for
`--kv-bytes-per-token`: what a prompt's KV costs on the WAN).

* MHA, GQA, MQA: K and V per KV head and layer: `2 * layers * kv_heads * head_dim`;
* MLA (DeepSeek-V2/V3 class, a config with `kv_lora_rank`): one latent row per layer, the compressed
  KV and the shared rope key: `layers * (kv_lora_rank + qk_rope_head_dim)`, as sglang's
  `MLATokenToKVPool` stores it;

times the bytes of the config's dtype (2 when it names none). KV cache quantization (fp8) is not read
from the config: pass `--kv-bytes-per-token` for it.
"""

from __future__ import annotations

import json
import os

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def per_token(c: dict) -> int:
    dtype_bytes = DTYPE_BYTES.get(str(c.get("torch_dtype") or c.get("dtype")), 2)
    layers = c["num_hidden_layers"]
    if c.get("kv_lora_rank"):
        return layers * (c["kv_lora_rank"] + c.get("qk_rope_head_dim", 64)) * dtype_bytes
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * layers * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * dtype_bytes


def from_config(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return per_token(json.load(f))
