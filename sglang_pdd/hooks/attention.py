"""The attention dispatch hook: MainDecode's handoff EXTEND may run sglang-pdd's handoff kernel.

`AttentionBackend.forward` is where every sglang attention backend that does not override it dispatches
a layer's call to `forward_extend` / `forward_decode`. The body returns sglang's own result at once
unless MainDecode armed the handoff path for the batch it is running (sglang_pdd.decode.main.handoff_attention).
"""

from __future__ import annotations

from sglang_pdd.decode.main.handoff_attention import ATTENTION


def around_attention_forward(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    if ATTENTION.armed_for is None:
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    return ATTENTION.forward(original, backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
