"""MD's handoff EXTEND through sglang-pdd's handoff attention kernel (docs/kernels.md section 3.1).

One AROUND hook on sglang's `AttentionBackend.forward` (`hooks/attention.py`) passes every attention call
of the process to `ATTENTION.forward`, which falls through to sglang's backend at once unless MainDecode
armed it for the batch it is about to run (`arm`, from the batch-selection hook, when `MainRuntime`
returns a handoff or catch-up EXTEND; `disarm` when its result is processed and on the next round). The
non-overlap and overlap decode loops both run that batch's forward inside `run_batch`, synchronously on
the scheduler thread, before the next round selects a batch, so nothing else runs while it is armed.

An armed call takes the kernel path only where the kernel computes what sglang's backend would
(`batch_refusal`, `layer_refusal`): an EXTEND of the armed batch's size, on CUDA, fp16/bf16, a plain
`MHATokenToKVPool` of q's dtype in its default layout, no logit cap, sliding window, sinks or other
extra inputs, a causal decoder layer, no CUDA graph or compile in progress. Everything else, CPU
included, goes to sglang's own path unchanged. An MLA pool (DeepSeek-style latent KV, `MLATokenToKVPool`) is
refused with reason "pool": the kernel attends over per-head K/V buffers, so MD computes t1..tk through
sglang's own MLA extend (the absorbed attention over the latent rows that sglang runs for every chunk of
a chunked prefill over a cached prefix). The kernel path does what a backend's `forward_extend`
does: it stores the new tokens' K/V in the pool, then attends over the pool (the kernel's "unified"
form). The checks and the launch plan are made on the first layer of a batch and rebound per layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_pdd import config, kernels
from sglang_pdd.server import metrics
from sglang_pdd.kernels import KernelArgumentError
from sglang_pdd.kernels.warmup import warm_up_handoff

logger = logging.getLogger(__name__)

POOL_CLASSES = ("MHATokenToKVPool",)  # exact classes: subclasses change layout or dtype (FP4, page-major...)


@dataclass(frozen=True)
class KernelPolicy:
    """Where the kernel path may run. Production: CUDA, fp16/bf16, the Triton kernels. The tests widen it:
    CPU and fp32 under Triton's interpreter, or the torch reference inside a CPU server (a test knob:
    ControlledMainRuntime (decode/main/controls.py) arms with CPU_TEST_POLICY under `handoff_kernel_cpu`)."""

    devices: tuple[str, ...] = ("cuda",)
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
    backend: str = "triton"  # "torch": handoff_attention's reference, per layer (no plan)
    config: Any = None  # HandoffAttentionConfig for the plan (the interpreter tests use small tiles)


CUDA_POLICY = KernelPolicy()
CPU_TEST_POLICY = KernelPolicy(devices=("cpu",), dtypes=(torch.float32, torch.float16, torch.bfloat16),
                               backend="torch")


def batch_refusal(fb: Any, q: torch.Tensor, backend: Any, armed_size: int | None, policy: KernelPolicy,
                  in_graph: bool = False) -> str | None:
    """Why this forward batch may not take the kernel path (None: it may). Checked once per batch."""
    if getattr(fb.forward_mode, "name", None) != "EXTEND":
        return "mode"
    if fb.batch_size != armed_size:
        return "batch"
    if q.device.type not in policy.devices:
        return q.device.type
    if in_graph:
        return "graph"
    if getattr(fb, "spec_info", None) is not None:
        return "spec"
    if getattr(fb, "encoder_lens", None) is not None:
        return "encoder"
    if getattr(fb, "mha_return_lse", False) or getattr(fb, "_attn_output", None) is not None:
        return "output"
    lens = (fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, fb.extend_prefix_lens, fb.extend_seq_lens)
    if any(x is None for x in lens):
        return "lens"
    if len(fb.extend_seq_lens_cpu) != fb.batch_size or sum(fb.extend_seq_lens_cpu) != q.shape[0]:
        return "padded"
    pool = getattr(backend, "token_to_kv_pool", None)
    if type(pool).__name__ not in POOL_CLASSES or getattr(backend, "req_to_token_pool", None) is None:
        return "pool"
    if getattr(pool, "use_hnd", False) or getattr(pool, "store_dtype", pool.dtype) != pool.dtype:
        return "pool layout"
    if getattr(getattr(backend, "kv_index_translator", None), "is_translating", False):
        return "translated"  # a unified / fused-draft pool: req_to_token holds virtual ids
    return None


def layer_refusal(q: torch.Tensor, k: Any, v: Any, layer: Any, pool: Any, kwargs: dict,
                  policy: KernelPolicy) -> str | None:
    """Why this layer's call may not take the kernel path (None: it may). Checked per layer."""
    if any(x is not None for x in kwargs.values()):
        return "extra inputs"  # sinks, k_rope, score_mod, descales...: not the kernel's contract
    if k is None or v is None:
        return "no k/v"
    if q.dtype not in policy.dtypes:
        return "dtype"
    if pool.dtype != q.dtype or k.dtype != q.dtype or v.dtype != q.dtype:
        return "kv dtype"
    if getattr(layer, "logit_cap", 0) and layer.logit_cap > 0:
        return "logit cap"
    if (getattr(layer, "sliding_window_size", -1) or -1) > -1:
        return "sliding window"
    if getattr(layer, "is_cross_attention", False) or getattr(layer.attn_type, "value", "decoder") != "decoder":
        return "not causal"
    if getattr(layer, "use_irope", False) or getattr(layer, "xai_temperature_len", -1) > 0:
        return "position-dependent attention"
    hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
    if (hkv != pool.head_num or layer.qk_head_dim != pool.head_dim or layer.v_head_dim != pool.v_head_dim
            or hkv <= 0 or hq % hkv or q.numel() != q.shape[0] * hq * layer.qk_head_dim):
        return "shape"
    return None


@dataclass
class _Batch:
    """What the armed batch's first layer decided, and what later layers reuse."""

    fb: Any
    refusal: str | None
    plan: Any = None
    plan_scale: float | None = None
    kernel_layers: int = 0
    fallback_layers: int = 0
    reasons: list[str] = field(default_factory=list)


def _record(path: str, reason: str) -> None:
    metrics.record_handoff_attention(path, reason)


class HandoffAttention:
    """The armed state and the kernel path. One per process (`ATTENTION`); tests make their own."""

    def __init__(self, policy: KernelPolicy | None = None, record: Callable[[str, str], None] = _record,
                 mode: str | None = None) -> None:
        self.armed_for: Any = None  # the ScheduleBatch MainDecode is running, or None
        self.armed_size: int | None = None
        self._fixed_policy = policy
        self.policy = policy or CUDA_POLICY
        self.mode = mode  # --pdd-handoff-attention, read on the first arm
        self.disabled: str | None = None  # "off" (--pdd-handoff-attention sglang), "kernel error" (it failed once)
        self._batch: _Batch | None = None
        self._record = record

    # -- arming (MainDecode's scheduler) -------------------------------------------------------------
    def arm(self, batch: Any, batch_size: int, policy: KernelPolicy | None = None) -> None:
        """Arm for `batch`, under `policy` (else the one given at construction, else CUDA_POLICY)."""
        self.disarm()
        if self.mode is None:
            self.mode = config.PddConfig.from_env().handoff_attention
        if self.mode == "sglang":
            self.disabled = "off"
        self.policy = policy or self._fixed_policy or CUDA_POLICY
        self.armed_for, self.armed_size = batch, batch_size

    def disarm(self, batch: Any = None) -> None:
        """End the armed window (only if `batch` is the armed one, when given) and count the batch."""
        if self.armed_for is None or (batch is not None and batch is not self.armed_for):
            return
        b, self._batch = self._batch, None
        self.armed_for = self.armed_size = None
        if b is None:
            return  # the armed batch never reached attention
        if b.kernel_layers and not b.fallback_layers:
            self._record("kernel", "")
        else:
            self._record("mixed" if b.kernel_layers else "sglang", b.refusal or (b.reasons[0] if b.reasons else ""))

    def warm_up(self, scheduler: Any) -> None:
        """At MD's start (CUDA only): compile the kernel's tile variants for this pool's geometry and
        check them against the reference; a kernel that disagrees stays off ("self-check")."""
        pool = scheduler.token_to_kv_pool_allocator.get_kvcache()
        if (config.PddConfig.from_env().handoff_attention == "sglang" or not torch.cuda.is_available()
                or type(pool).__name__ not in POOL_CLASSES or pool.dtype not in self.policy.dtypes):
            return

        try:
            q_heads = scheduler.model_config.num_attention_heads // max(1, getattr(scheduler, "tp_size", 1))
            rep = warm_up_handoff(q_heads, pool.head_num, pool.head_dim, pool.v_head_dim, pool.dtype,
                                  pool.k_buffer[0].device, page_size=pool.page_size)
        except Exception:
            logger.exception("handoff attention warm-up failed; using sglang's attention backend")
            self.disabled = "warm-up error"
            return
        if rep.ok:
            logger.info("handoff attention kernel warmed up: %d variants in %.1fs", len(rep.variants), rep.seconds)
        else:
            logger.error("handoff attention kernel disagrees with its reference (%s); using sglang's backend",
                         "; ".join(rep.mismatches))
            self.disabled = "self-check"

    # -- every attention call while armed --------------------------------------------------------
    def forward(self, original: Callable, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: Any, fb: Any,
                save_kv_cache: bool = True, **kwargs: Any) -> Any:
        b = self._batch
        if b is None or b.fb is not fb:
            b = self._batch = _Batch(fb=fb, refusal=self.disabled or batch_refusal(
                fb, q, backend, self.armed_size, self.policy, in_graph=_in_graph()))
        reason = b.refusal or layer_refusal(q, k, v, layer, backend.token_to_kv_pool, kwargs, self.policy)
        if reason is None:
            try:
                out = self._run(b, backend, q, k, v, layer, fb, save_kv_cache)
                b.kernel_layers += 1
                return out
            except KernelArgumentError as e:  # this batch is outside the kernel's contract
                logger.warning("handoff attention kernel refused the batch (%s); sglang's path for it", e)
                b.refusal = reason = "arguments"
            except Exception:  # never the scheduler: sglang's path for this and every later batch
                logger.exception("handoff attention kernel failed; using sglang's attention backend from now on")
                self.disabled = b.refusal = reason = "kernel error"
        b.fallback_layers += 1
        if reason not in b.reasons:
            b.reasons.append(reason)
        return original(backend, q, k, v, layer, fb, save_kv_cache, **kwargs)

    def _run(self, b: _Batch, backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any,
             fb: Any, save_kv_cache: bool) -> torch.Tensor:
        pool = backend.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, _write_loc(fb, layer), k, v)
        t, hq = q.shape[0], layer.tp_q_head_num
        q3 = q.reshape(t, hq, layer.qk_head_dim)  # a view of sglang's [T, Hq*D] rows
        o = q.new_empty((t, hq * layer.v_head_dim))
        o3 = o.view(t, hq, layer.v_head_dim)
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        req_to_token = backend.req_to_token_pool.req_to_token
        if self.policy.backend == "torch":
            kernels.handoff_attention(
                q3, k_buf, v_buf, req_to_token, fb.req_pool_indices, fb.extend_prefix_lens, fb.extend_seq_lens,
                sm_scale=layer.scaling, page_size=pool.page_size, out=o3, prefix_lens_cpu=fb.extend_prefix_lens_cpu,
                extend_lens_cpu=fb.extend_seq_lens_cpu, validate_indices=True, backend="torch")
            return o
        plan = None
        if b.plan is not None and b.plan_scale == layer.scaling:
            try:
                plan = kernels.rebind_plan(b.plan, q3, k_buf, v_buf, o3)
            except kernels.KernelArgumentError:  # a layer of another geometry: plan it anew
                plan = None
        if plan is None:
            plan = kernels.prepare_handoff_attention(
                q3, k_buf, v_buf, req_to_token, fb.req_pool_indices, fb.extend_prefix_lens, fb.extend_seq_lens,
                sm_scale=layer.scaling, page_size=pool.page_size, out=o3, prefix_lens_cpu=fb.extend_prefix_lens_cpu,
                extend_lens_cpu=fb.extend_seq_lens_cpu, validate_indices=False, config=self.policy.config)
            b.plan, b.plan_scale = plan, layer.scaling
        kernels.run_plan(plan)
        return o


def _in_graph() -> bool:
    """A CUDA graph capture, a prefill-graph scope or torch.compile tracing: sglang's path only."""
    if torch.compiler.is_compiling():
        return True
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    try:
        from sglang.srt.model_executor.runner_utils.prefill_graph import is_in_prefill_graph_scope
    except ImportError:  # the stand-alone GPU check runs without sglang
        return False
    return is_in_prefill_graph_scope()


def _write_loc(fb: Any, layer: Any) -> Any:
    """Where the new tokens' K/V go: sglang's `KVWriteLoc` for the layer (what the backends pass)."""
    try:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    except ImportError:  # the stand-alone GPU check's pool takes the bare locations
        return fb.out_cache_loc
    return KVWriteLoc.for_layer(fb, layer)


ATTENTION = HandoffAttention()
