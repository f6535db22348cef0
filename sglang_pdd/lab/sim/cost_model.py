"""Roofline cost of one forward step on one instance.

step time = max(FLOPs / (peak * MFU(tokens)), bytes / (HBM bandwidth * MBU))
            + parallel communication + a fixed per-step overhead

* Prefill: a batch of chunks (new tokens c over a cached/already-computed prefix p). FLOPs are
  2 * active params per token plus attention over p + c/2 keys on average; bytes are the
  weights touched, the prefix KV read once per chunk and the new KV written.
* Decode: one token for each of `batch` requests; attention reads every request's whole KV.
* Handoff EXTEND (MD recomputing eager tokens): a prefill step whose chunks are tiny (k tokens
  over a long prefix): cheap in FLOPs, dominated by weights and KV reads, like a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sglang_pdd.lab.sim.hardware import InstanceSpec
from sglang_pdd.lab.sim.model import ModelSpec


@dataclass(frozen=True)
class Chunk:
    new_tokens: int
    prefix_tokens: int


class CostModel:
    def __init__(self, model: ModelSpec, inst: InstanceSpec):
        self.model, self.inst = model, inst
        free = inst.mem_bytes - model.weight_bytes
        if free <= 0:
            raise ValueError(f"{model.name} ({model.weight_bytes / 1e9:.0f} GB) does not fit on "
                             f"{inst.chips} x {inst.chip.name}")
        self.kv_capacity_tokens = int(free // model.kv_bytes_per_token)
        # constants of the hot path (decode steps run ~1e5 times per simulation)
        e = inst.eff
        self._flops, self._bw = inst.flops, inst.mem_bw
        self._mfu_max, self._half, self._overhead = e.mfu, e.mfu_half_tokens, e.step_overhead_s
        self._comm_per_tok = (model.comm_bytes_per_token / inst.interconnect) if inst.chips > 1 else 0.0
        self._wbytes: dict[int, float] = {}

    def _weights(self, tokens: int) -> float:
        w = self._wbytes.get(tokens)
        if w is None:
            w = self._wbytes[tokens] = self.model.weight_bytes_read(tokens)
        return w

    def step_time(self, tokens: int, gemm_flops: float, attn_flops: float, bytes_: float) -> float:
        """GEMM FLOPs run at the token-dependent MFU; attention FLOPs at full MFU (their
        small-batch inefficiency is memory-bound and already counted in `bytes_`)."""
        if tokens <= 0:
            return 0.0
        mfu = self._mfu_max * tokens / (tokens + self._half)
        compute = (gemm_flops / mfu + attn_flops / self._mfu_max) / self._flops
        memory = bytes_ / self._bw
        return max(compute, memory) + tokens * self._comm_per_tok + self._overhead

    def prefill_step_s(self, chunks: Sequence[Chunk]) -> float:
        m = self.model
        tokens = sum(c.new_tokens for c in chunks)
        gemm = 2.0 * m.active_params * tokens
        attn, kv_read = 0.0, 0
        for c in chunks:
            attn += m.attn_flops_per_pair * c.new_tokens * (c.prefix_tokens + c.new_tokens / 2)
            kv_read += c.prefix_tokens
        bytes_ = self._weights(tokens) + (kv_read + tokens) * m.kv_bytes_per_token
        return self.step_time(tokens, gemm, attn, bytes_)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step for `batch` requests holding `context_tokens` KV tokens in total."""
        if batch <= 0:
            return 0.0
        m = self.model
        gemm = 2.0 * m.active_params * batch
        attn = m.attn_flops_per_pair * context_tokens
        bytes_ = self._weights(batch) + (context_tokens + batch) * m.kv_bytes_per_token
        return self.step_time(batch, gemm, attn, bytes_)

    def extend_s(self, chunks: Sequence[Chunk]) -> float:
        """The handoff EXTEND: same physics as prefill, listed apart for clarity."""
        return self.prefill_step_s(chunks)

    def prefill_request_s(self, new_tokens: int, prefix_tokens: int, chunk_size: int) -> float:
        """A request prefilled alone in chunks of `chunk_size` (used for estimates and tests)."""
        total, done = 0.0, 0
        while done < new_tokens:
            c = min(chunk_size, new_tokens - done)
            total += self.prefill_step_s([Chunk(c, prefix_tokens + done)])
            done += c
        return total
