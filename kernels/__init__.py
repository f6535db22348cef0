"""Triton kernels of sglang-pdd, imported as `sglang_pdd.kernels`.

* `handoff_attention` — MD's handoff EXTEND: k new tokens per request over a long cached prefix, read from
  sglang's token pool through `req_to_token` (split-KV partial pass + reduction).
* `pack_kv` / `unpack_kv` — one request's KV rows of all layers into one staging buffer for the WAN
  (optionally fp8 e4m3 with per-block scales), and the scatter back into MD's slots.

Each launcher validates its arguments, runs Triton on CUDA (or under TRITON_INTERPRET=1) and falls back to
a plain-torch reference elsewhere. This package imports without triton: the kernel modules load lazily.
"""

from __future__ import annotations

from .backend import resolve_backend, triton_available
from .checks import KernelArgumentError
from .handoff_attention import (
    HandoffPlan,
    handoff_attention,
    prepare_handoff_attention,
    rebind_plan,
    run_plan,
)
from .handoff_attention_ref import handoff_attention_ref
from .handoff_tiling import HandoffAttentionConfig
from .kv_pack import pack_kv, unpack_kv
from .kv_pack_layout import PackLayout
from .kv_pack_ref import pack_kv_ref, unpack_kv_ref

__all__ = [
    "HandoffAttentionConfig",
    "HandoffPlan",
    "KernelArgumentError",
    "PackLayout",
    "handoff_attention",
    "handoff_attention_ref",
    "pack_kv",
    "pack_kv_ref",
    "prepare_handoff_attention",
    "rebind_plan",
    "resolve_backend",
    "run_plan",
    "triton_available",
    "unpack_kv",
    "unpack_kv_ref",
]
