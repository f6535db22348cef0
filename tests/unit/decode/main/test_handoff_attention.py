"""MainDecode's attention hook (sglang_pdd.decode.main.handoff_attention) with fakes: when the handoff kernel may
run, and that everything else reaches sglang's own attention path with the very same arguments."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from sglang_pdd.config import PddConfig
from sglang_pdd.decode.main.handoff_attention import (CPU_TEST_POLICY, CUDA_POLICY, HandoffAttention, KernelPolicy,
                                               batch_refusal, layer_refusal)
from sglang_pdd.server.roles import Role

from tests.fakes.attention import FakeAttnBackend, FakeForwardBatch, FakeMode, RadixAttention
from tests.fakes.kv_pool import MHATokenToKVPool, ReqToTokenPool

CPU_POLICY = KernelPolicy(devices=("cpu",), dtypes=(torch.float32,))
PREFIX, EXTEND = [5, 3], [2, 1]


class Case:
    """Two requests (prefixes 5 and 3, extends 2 and 1) over a 2-layer pool, GQA 4/2, head dim 8."""

    def __init__(self, layers: int = 2, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.layers = [RadixAttention(layer_id=i) for i in range(layers)]
        self.pool = MHATokenToKVPool(slots=32, head_num=2, head_dim=8, layer_num=layers)
        self.rows = ReqToTokenPool(size=3, max_context_len=16)
        self.backend = FakeAttnBackend(self.pool, self.rows)
        slots = [torch.arange(10, 10 + PREFIX[0] + EXTEND[0]), torch.arange(20, 20 + PREFIX[1] + EXTEND[1])]
        for row, s in zip((1, 2), slots):
            self.rows.req_to_token[row, : len(s)] = s.int()
        for buf in self.pool.k_buffer + self.pool.v_buffer:  # the cached prefixes
            buf.copy_(torch.randn(buf.shape, generator=gen))
        new = torch.cat([s[p:] for s, p in zip(slots, PREFIX)])
        self.fb = FakeForwardBatch(batch_size=2, extend_prefix_lens_cpu=list(PREFIX),
                                   extend_seq_lens_cpu=list(EXTEND),
                                   req_pool_indices=torch.tensor([1, 2]), out_cache_loc=new)
        t = sum(EXTEND)
        self.q = [torch.randn(t, 4 * 8, generator=gen) for _ in self.layers]
        self.k = [torch.randn(t, 2, 8, generator=gen) for _ in self.layers]
        self.v = [torch.randn(t, 2, 8, generator=gen) for _ in self.layers]

    def call(self, attn: HandoffAttention, i: int, **kwargs):
        return attn.forward(self.backend.original, self.backend, self.q[i], self.k[i], self.v[i], self.layers[i],
                            self.fb, True, **kwargs)

    def expected(self, i: int) -> torch.Tensor:
        """Dense causal attention of each request's new tokens over its prefix (independent of the kernels)."""
        layer, out, start = self.layers[i], [], 0
        k_buf, v_buf = self.pool.get_key_buffer(i).clone(), self.pool.get_value_buffer(i).clone()
        k_buf[self.fb.out_cache_loc], v_buf[self.fb.out_cache_loc] = self.k[i], self.v[i]
        for row, p, e in zip((1, 2), PREFIX, EXTEND):
            slots = self.rows.req_to_token[row, : p + e].long()
            q = self.q[i][start : start + e].view(e, 4, 8).transpose(0, 1)
            keys = k_buf[slots].repeat_interleave(2, dim=1).transpose(0, 1)
            vals = v_buf[slots].repeat_interleave(2, dim=1).transpose(0, 1)
            mask = torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=layer.scaling)
            out.append(o.transpose(0, 1).reshape(e, 32))
            start += e
        return torch.cat(out)


def armed(policy=None, mode="auto"):
    records = []
    attn = HandoffAttention(policy=policy, record=lambda path, reason: records.append((path, reason)), mode=mode)
    attn.records = records
    return attn


def test_unarmed_hook_hands_sglang_the_very_same_arguments():
    from sglang_pdd.hooks.attention import around_attention_forward

    c = Case()
    out = around_attention_forward(c.backend.original, c.backend, c.q[0], c.k[0], c.v[0], c.layers[0], c.fb,
                                   False, sinks=None)
    assert out == ("sglang", 0)
    (call,) = c.backend.calls
    assert call[0] is c.backend and call[1] is c.q[0] and call[2] is c.k[0] and call[3] is c.v[0]
    assert call[4] is c.layers[0] and call[5] is c.fb and call[6] is False and call[7] == {"sinks": None}


def test_armed_on_cpu_falls_through_unchanged_and_counts_why():
    c, attn = Case(), armed()  # the production policy: CUDA only
    before = [b.clone() for b in c.pool.k_buffer]
    attn.arm(object(), 2)
    assert attn.policy == CUDA_POLICY
    batch = attn.armed_for
    outs = [c.call(attn, i) for i in range(2)]
    assert outs == [("sglang", 0), ("sglang", 1)]
    assert [call[1] for call in c.backend.calls] == c.q and not c.pool.writes
    assert all(torch.equal(a, b) for a, b in zip(before, c.pool.k_buffer))
    attn.disarm(object())  # not the armed batch: still armed
    assert attn.armed_for is batch and attn.records == []
    attn.disarm(batch)
    assert attn.armed_for is None and attn.records == [("sglang", "cpu")]


def test_the_kernel_path_attends_over_the_pool_and_stores_the_new_kv():
    c, attn = Case(), armed(CPU_TEST_POLICY)
    attn.arm(object(), 2)
    outs = [c.call(attn, i) for i in range(2)]
    for i, out in enumerate(outs):
        torch.testing.assert_close(out, c.expected(i), rtol=1e-5, atol=1e-5)
        assert torch.equal(c.pool.get_key_buffer(i)[c.fb.out_cache_loc], c.k[i])
        assert torch.equal(c.pool.get_value_buffer(i)[c.fb.out_cache_loc], c.v[i])
    assert c.backend.calls == []
    assert [w[0] for w in c.pool.writes] == [0, 1]
    attn.disarm()
    assert attn.records == [("kernel", "")]


def test_a_refused_layer_makes_the_batch_mixed():
    c, attn = Case(), armed(CPU_TEST_POLICY)
    c.layers[1].logit_cap = 30.0
    attn.arm(object(), 2)
    assert isinstance(c.call(attn, 0), torch.Tensor)
    assert c.call(attn, 1) == ("sglang", 1)
    attn.disarm()
    assert attn.records == [("mixed", "logit cap")]


def test_off_mode_always_uses_sglang():
    c, attn = Case(), armed(CPU_TEST_POLICY, mode="sglang")
    attn.arm(object(), 2)
    assert [c.call(attn, i) for i in range(2)] == [("sglang", 0), ("sglang", 1)]
    attn.disarm()
    assert attn.records == [("sglang", "off")]


def test_a_kernel_failure_falls_back_now_and_for_every_later_batch(monkeypatch):
    c, attn = Case(), armed(CPU_TEST_POLICY)
    monkeypatch.setattr(attn, "_run", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    attn.arm(object(), 2)
    assert c.call(attn, 0) == ("sglang", 0)
    attn.arm(object(), 2)  # the next round disarms the last batch and arms the new one
    monkeypatch.undo()
    assert c.call(attn, 0) == ("sglang", 0)
    attn.disarm()
    assert attn.records == [("sglang", "kernel error"), ("sglang", "kernel error")]


def test_a_batch_outside_the_kernels_contract_falls_back_alone(monkeypatch):
    from sglang_pdd.kernels import KernelArgumentError

    c, attn = Case(), armed(CPU_TEST_POLICY)
    monkeypatch.setattr(attn, "_run", lambda *a: (_ for _ in ()).throw(KernelArgumentError("width")))
    attn.arm(object(), 2)
    assert c.call(attn, 0) == ("sglang", 0) and c.call(attn, 1) == ("sglang", 1)
    monkeypatch.undo()
    attn.arm(object(), 2)
    assert isinstance(c.call(attn, 0), torch.Tensor)
    attn.disarm()
    assert attn.records == [("sglang", "arguments"), ("kernel", "")]


def test_arm_reads_the_flag_and_takes_the_policy_it_is_given():
    PddConfig(role=Role.MAIN, handoff_attention="sglang").export_env()
    try:
        attn = HandoffAttention(record=lambda *a: None)
        attn.arm(object(), 1, policy=CPU_TEST_POLICY)
        assert attn.mode == "sglang" and attn.disabled == "off" and attn.policy == CPU_TEST_POLICY
        attn.arm(object(), 1)
        assert attn.policy == CUDA_POLICY
    finally:
        PddConfig().export_env()


def test_main_runtime_arms_with_the_cpu_policy_under_its_test_knob(tmp_path):
    from types import SimpleNamespace

    from sglang_pdd.decode.main.controls import ControlledMainRuntime
    from sglang_pdd.decode.rank_sync import RankSync
    from sglang_pdd.test_switches import TestSwitches

    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"handoff_kernel_cpu": True}))
    batch = SimpleNamespace(batch_size=lambda: 1)
    rt = ControlledMainRuntime.__new__(ControlledMainRuntime)
    rt.scheduler = SimpleNamespace(dp_attn_adapter=SimpleNamespace(maybe_prepare_mlp_sync_batch=lambda b: b))
    rt.attention, rt.switches = HandoffAttention(record=lambda *a: None), TestSwitches(knobs_file=str(knobs))
    rt.sync = RankSync(SimpleNamespace(tp_size=1))
    rt._select = lambda running: (batch, running)
    assert rt.next_batch("running") == (batch, "running")
    assert rt.attention.armed_for is batch and rt.attention.policy == CPU_TEST_POLICY
    knobs.write_text("{}")
    rt.next_batch("running")
    assert rt.attention.policy == CUDA_POLICY


@pytest.mark.parametrize("change, reason", [
    (lambda c: setattr(c.fb, "forward_mode", FakeMode("DECODE")), "mode"),
    (lambda c: setattr(c.fb, "forward_mode", FakeMode("TARGET_VERIFY")), "mode"),
    (lambda c: setattr(c.fb, "batch_size", 3), "batch"),
    (lambda c: setattr(c.fb, "spec_info", object()), "spec"),
    (lambda c: setattr(c.fb, "encoder_lens", torch.tensor([4, 4])), "encoder"),
    (lambda c: setattr(c.fb, "_attn_output", torch.empty(3, 32)), "output"),
    (lambda c: setattr(c.fb, "extend_seq_lens_cpu", None), "lens"),
    (lambda c: setattr(c.fb, "extend_seq_lens_cpu", [2, 2]), "padded"),
    (lambda c: setattr(c.backend, "token_to_kv_pool", object()), "pool"),
    (lambda c: setattr(c.pool, "use_hnd", True), "pool layout"),
    (lambda c: setattr(c.pool, "store_dtype", torch.uint8), "pool layout"),
    (lambda c: setattr(c.backend, "kv_index_translator", FakeMode("translator")), None),  # sglang sets one always
    (lambda c: setattr(c.backend, "kv_index_translator", type("T", (), {"is_translating": True})()), "translated"),
])
def test_batch_refusals(change, reason):
    c = Case()
    assert batch_refusal(c.fb, c.q[0], c.backend, 2, CPU_POLICY) is None
    assert batch_refusal(c.fb, c.q[0], c.backend, 2, CPU_POLICY, in_graph=True) == "graph"
    assert batch_refusal(c.fb, c.q[0], c.backend, 2, CUDA_POLICY) == "cpu"
    change(c)
    assert batch_refusal(c.fb, c.q[0], c.backend, 2, CPU_POLICY) == reason


@pytest.mark.parametrize("change, reason", [
    (lambda c: c.kw.update(sinks=torch.zeros(4)), "extra inputs"),
    (lambda c: c.kw.update(k_rope=torch.zeros(3, 2, 8)), "extra inputs"),
    (lambda c: setattr(c, "k", None), "no k/v"),
    (lambda c: setattr(c, "q", c.q.double()), "dtype"),
    (lambda c: setattr(c.pool, "dtype", torch.float16), "kv dtype"),
    (lambda c: setattr(c, "layer", replace(c.layer, logit_cap=30.0)), "logit cap"),
    (lambda c: setattr(c, "layer", replace(c.layer, sliding_window_size=4)), "sliding window"),
    (lambda c: setattr(c, "layer", replace(c.layer, is_cross_attention=True)), "not causal"),
    (lambda c: setattr(c.layer.attn_type, "value", "encoder_only"), "not causal"),
    (lambda c: setattr(c, "layer", replace(c.layer, use_irope=True)), "position-dependent attention"),
    (lambda c: setattr(c, "layer", replace(c.layer, num_kv_heads=1)), "shape"),
    (lambda c: setattr(c, "layer", replace(c.layer, num_heads=3)), "shape"),
])
def test_layer_refusals(change, reason):
    c = Case()
    c.q, c.k, c.layer, c.kw = c.q[0], c.k[0], c.layers[0], {"sinks": None}
    assert layer_refusal(c.q, c.k, c.k, c.layer, c.pool, c.kw, CPU_POLICY) is None
    assert layer_refusal(c.q, c.k, c.k, c.layer, c.pool, c.kw, CUDA_POLICY) == "dtype"  # fp32: not on CUDA
    change(c)
    assert layer_refusal(c.q, c.k, c.k, c.layer, c.pool, c.kw, CPU_POLICY) == reason
