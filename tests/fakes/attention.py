"""sglang's attention seam as MD's handoff attention hook meets it: the `RadixAttention` layer, the forward
batch and its mode, and an attention backend (the pools, and sglang's own `forward` recorded).

Torch only: the kernel tests use these on a GPU box without sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class FakeMode:
    """An enum member of sglang's (`ForwardMode.EXTEND`, `AttentionType.DECODER`): its `name` and `value`."""

    def __init__(self, name: str = "EXTEND"):
        self.name = name
        self.value = name.lower()


@dataclass
class RadixAttention:
    """sglang's `RadixAttention` layer (sglang.srt.layers.radix_attention), with its leading arguments in
    its order (num_heads, head_dim, scaling, num_kv_heads, layer_id) and the attributes the backends and
    the hook read (tp_q_head_num, qk_head_dim, ...). A dataclass: `dataclasses.replace` changes one
    argument and derives the rest again. Defaults: GQA 4/2, head dim 8."""

    num_heads: int = 4
    head_dim: int = 8
    scaling: float = 8 ** -0.5
    num_kv_heads: int = 2
    layer_id: int = 0
    logit_cap: float = 0.0
    v_head_dim: int = -1  # sglang's: -1 is head_dim
    sliding_window_size: int = -1
    is_cross_attention: bool = False
    attn_type: FakeMode = field(default_factory=lambda: FakeMode("DECODER"))
    use_irope: bool = False
    xai_temperature_len: int = -1
    tp_q_head_num: int = field(init=False)
    tp_k_head_num: int = field(init=False)
    tp_v_head_num: int = field(init=False)
    qk_head_dim: int = field(init=False)
    k_scale: object = field(init=False, default=None)
    v_scale: object = field(init=False, default=None)

    def __post_init__(self):
        self.tp_q_head_num, self.tp_k_head_num = self.num_heads, self.num_kv_heads
        self.tp_v_head_num, self.qk_head_dim = self.num_kv_heads, self.head_dim
        if self.v_head_dim == -1:
            self.v_head_dim = self.head_dim
        self.attn_type.value = "decoder"


@dataclass
class FakeForwardBatch:
    """sglang's `ForwardBatch` of an EXTEND (by default): the per-request prefix and extend lengths, the
    requests' req_to_token rows, and the slots the new tokens' KV goes to; tensors on `device`."""

    batch_size: int
    extend_prefix_lens_cpu: list
    extend_seq_lens_cpu: list
    req_pool_indices: object = None
    out_cache_loc: object = None
    out_cache_loc_is_physical: bool = False
    forward_mode: object = field(default_factory=FakeMode)
    spec_info: object = None
    encoder_lens: object = None
    mha_return_lse: bool = False
    device: object = "cpu"
    _attn_output: object = None

    def __post_init__(self):
        def ints(values):
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        self.extend_prefix_lens = ints(self.extend_prefix_lens_cpu)
        self.extend_seq_lens = ints(self.extend_seq_lens_cpu)
        self.seq_lens = torch.tensor([p + e for p, e in zip(self.extend_prefix_lens_cpu, self.extend_seq_lens_cpu)],
                                     device=self.device)


class FakeAttnBackend:
    """An attention backend: the pools, and `original` recording what reached sglang's own path."""

    def __init__(self, pool, req_to_token_pool):
        self.token_to_kv_pool, self.req_to_token_pool = pool, req_to_token_pool
        self.kv_index_translator = None
        self.calls: list[tuple] = []

    def original(self, backend, q, k, v, layer, fb, save_kv_cache=True, **kwargs):
        """Stands for the unhooked `AttentionBackend.forward` (returns a marker, writes nothing)."""
        self.calls.append((backend, q, k, v, layer, fb, save_kv_cache, kwargs))
        return ("sglang", layer.layer_id)
