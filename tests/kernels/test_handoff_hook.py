"""MainDecode's attention hook on real inputs: the kernel path (sglang_pdd.decode.main.handoff_attention) against
sglang's own EXTEND attention, layer by layer, and greedy tokens of a small model with the hook on and off.

"Original" is sglang's `AttentionBackend.forward` over its torch_native backend, a real `MHATokenToKVPool`
and `RadixAttention` layers, when sglang imports; on a GPU box without sglang (the device machine) the
stand-ins of tests.fakes and pool_fakes.py, which compute what torch_native computes. On CPU the kernel runs
in Triton's interpreter (fp32, small tiles); with CUDA it runs compiled in fp16 and bf16 under the production
policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from pool_fakes import paged_slots

from tests.fakes.attention import FakeForwardBatch

from sglang_pdd import kernels
from sglang_pdd.kernels import HandoffAttentionConfig
from sglang_pdd.decode.main.handoff_attention import CUDA_POLICY, HandoffAttention, KernelPolicy

pytest.importorskip("triton")
HAS_CUDA = torch.cuda.is_available()
DTYPES = (torch.float16, torch.bfloat16) if HAS_CUDA else (torch.float32,)
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (5e-3, 1e-2), torch.bfloat16: (3e-2, 3e-2)}
POLICY = CUDA_POLICY if HAS_CUDA else KernelPolicy(
    devices=("cpu",), dtypes=(torch.float32,),
    config=HandoffAttentionConfig(block_m=16, block_n=16, split_len=64))


@dataclass
class Parts:
    real: bool  # sglang's classes (else the stand-ins)
    Pool: Any
    Rows: Any
    Layer: Any
    backend: Callable[[Any], Any]
    original: Callable  # the unhooked AttentionBackend.forward
    extend: Any  # ForwardMode.EXTEND


@pytest.fixture(scope="module")
def parts() -> Parts:
    try:
        from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
    except Exception:  # no sglang here: the stand-ins
        from pool_fakes import SdpaExtendBackend

        from tests.fakes.attention import FakeMode, RadixAttention
        from tests.fakes.kv_pool import MHATokenToKVPool, ReqToTokenPool

        return Parts(False, MHATokenToKVPool, ReqToTokenPool, RadixAttention, SdpaExtendBackend,
                     SdpaExtendBackend.forward, FakeMode("EXTEND"))
    return Parts(True, MHATokenToKVPool, ReqToTokenPool, RadixAttention, TorchNativeAttnBackend,
                 AttentionBackend.forward, ForwardMode.EXTEND)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


class Server:
    """One decode server's attention state: pools, backend, layers; requests own rows 1..B."""

    def __init__(self, parts: Parts, device, dtype, page: int, layers: int, hq: int, hkv: int, d: int,
                 slots: int = 1024, width: int = 512):
        self.parts, self.device = parts, device
        self.pool = parts.Pool(size=slots, page_size=page, dtype=dtype, head_num=hkv, head_dim=d, layer_num=layers,
                               device=str(device), enable_memory_saver=False)
        self.rows = parts.Rows(size=8, max_context_len=width, device=str(device), enable_memory_saver=False)
        runner = SimpleNamespace(device=str(device), token_to_kv_pool=self.pool, req_to_token_pool=self.rows)
        self.backend = parts.backend(runner)
        if parts.real:  # what ModelRunner.bind_and_verify_backends gives every backend (identity here)
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

            self.backend.kv_index_translator = KVIndexTranslator(
                req_to_token=self.rows.req_to_token, token_to_kv_pool_allocator=None,
                token_to_kv_pool=self.pool, page_size=page, device=str(device))
        self.layers = [parts.Layer(hq, d, 1.0 / math.sqrt(d), hkv, layer_id=i) for i in range(layers)]

    def batch(self, prefix: list[int], extend: list[int]) -> FakeForwardBatch:
        rows = torch.arange(1, len(prefix) + 1, device=self.device)
        loc = torch.cat([self.rows.req_to_token[r, p : p + e] for r, p, e in zip(rows.tolist(), prefix, extend)])
        return FakeForwardBatch(batch_size=len(prefix), extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=extend,
                                req_pool_indices=rows, out_cache_loc=loc, forward_mode=self.parts.extend,
                                device=self.device)

    def attend(self, attn: HandoffAttention | None, q, k, v, layer, fb):
        if attn is not None and attn.armed_for is not None:  # what hooks/attention.py does
            return attn.forward(self.parts.original, self.backend, q, k, v, layer, fb, True)
        return self.parts.original(self.backend, q, k, v, layer, fb, True)


def place_requests(servers: list[Server], kv_lens: list[int], page: int, seed: int) -> None:
    """The same fragmented paged slots for each request on every server (rows 1..B)."""
    gen = torch.Generator().manual_seed(seed)
    slots = paged_slots(kv_lens, page, servers[0].pool.size, gen)
    for s in servers:
        for b, sl in enumerate(slots):
            s.rows.req_to_token[b + 1, : sl.numel()] = (sl + page).int().to(s.device)  # keep clear of slot 0


def recorder() -> HandoffAttention:
    records: list = []
    attn = HandoffAttention(policy=POLICY, record=lambda p, r: records.append((p, r)), mode="auto")
    attn.records = records
    return attn


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hooked_extend_equals_sglangs_extend_layer_by_layer(parts, device, dtype, page, monkeypatch):
    hq, hkv, d, prefix, extend = 8, 2, 64, [40, 130, 7], [3, 1, 9]
    ref, hooked = (Server(parts, device, dtype, page, 3, hq, hkv, d) for _ in range(2))
    place_requests([ref, hooked], [p + e for p, e in zip(prefix, extend)], page, seed=1)
    gen = torch.Generator().manual_seed(2)
    for layer_id in range(3):  # the cached prefixes (and everything else): the same random KV on both
        for buf in (ref.pool.get_key_buffer(layer_id), ref.pool.get_value_buffer(layer_id)):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
        hooked.pool.get_key_buffer(layer_id).copy_(ref.pool.get_key_buffer(layer_id))
        hooked.pool.get_value_buffer(layer_id).copy_(ref.pool.get_value_buffer(layer_id))
    plans = []
    monkeypatch.setattr(kernels, "prepare_handoff_attention",
                        lambda *a, _f=kernels.prepare_handoff_attention, **kw: plans.append(1) or _f(*a, **kw))
    attn, t = recorder(), sum(extend)
    fb_ref, fb_hooked = ref.batch(prefix, extend), hooked.batch(prefix, extend)
    attn.arm(object(), len(prefix))
    for layer_id in range(3):
        qkv = torch.randn((t, (hq + 2 * hkv) * d), generator=gen).to(dtype).to(device)  # q, k, v: views of qkv
        q = qkv[:, : hq * d]
        k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        want = ref.attend(None, q, k, v, ref.layers[layer_id], fb_ref)
        got = hooked.attend(attn, q, k, v, hooked.layers[layer_id], fb_hooked)
        assert got.shape == want.shape == (t, hq * d) and got.dtype == want.dtype
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        assert torch.equal(hooked.pool.get_key_buffer(layer_id), ref.pool.get_key_buffer(layer_id))
        assert torch.equal(hooked.pool.get_value_buffer(layer_id), ref.pool.get_value_buffer(layer_id))
    attn.disarm()
    assert attn.records == [("kernel", "")]
    assert plans == [1]  # planned on the first layer, rebound on the others


class TinyLM:
    """Embedding + learned positions, `layers` x (qkv, attention through a server, output projection,
    residual), tied logits. Enough to turn attention differences into different greedy tokens."""

    def __init__(self, device, dtype, vocab=97, layers=3, hq=8, hkv=2, d=32, max_pos=512, seed=3):
        gen = torch.Generator().manual_seed(seed)
        h = hq * d
        self.hq, self.hkv, self.d, self.layers = hq, hkv, d, layers

        def w(*shape, scale=1.0):
            return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)

        self.emb, self.pos = w(vocab, h), w(max_pos, h, scale=0.3)
        self.wqkv = [w(h, (hq + 2 * hkv) * d, scale=h ** -0.5) for _ in range(layers)]
        self.wo = [w(h, h, scale=h ** -0.5) for _ in range(layers)]

    def logits(self, server: Server, attn, fb, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, hq, hkv, d = self.emb[ids] + self.pos[positions], self.hq, self.hkv, self.d
        for i in range(self.layers):
            qkv = x @ self.wqkv[i]
            k = qkv[:, hq * d : (hq + hkv) * d].view(-1, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(-1, hkv, d)
            x = x + server.attend(attn, qkv[:, : hq * d], k, v, server.layers[i], fb) @ self.wo[i]
        return (x @ self.emb.T).float()


def greedy_after_handoff(model: TinyLM, server: Server, attn, prompts, eager, steps: int):
    """Prefill the prompts (sglang's path), run the eager tokens as one EXTEND (armed when `attn`), then
    decode `steps` tokens one EXTEND of 1 at a time (sglang's path). Returns tokens and handoff logits."""
    dev = server.device

    def run(prefix, new, armed):
        fb = server.batch(prefix, [len(x) for x in new])
        ids = torch.tensor([t for x in new for t in x], device=dev)
        pos = torch.tensor([p + i for p, x in zip(prefix, new) for i in range(len(x))], device=dev)
        if armed:
            attn.arm(object(), len(prefix))
        logits = model.logits(server, attn if armed else None, fb, ids, pos)
        if armed:
            attn.disarm()
        last = torch.tensor([len(x) for x in new], device=dev).cumsum(0) - 1
        return logits[last]

    lens = [0] * len(prompts)
    run(lens, prompts, False)
    lens = [len(p) for p in prompts]
    handoff = run(lens, eager, attn is not None)
    lens = [n + len(e) for n, e in zip(lens, eager)]
    out = [[t] for t in handoff.argmax(-1).tolist()]
    for _ in range(steps - 1):
        nxt = run(lens, [[o[-1]] for o in out], False).argmax(-1).tolist()
        lens = [n + 1 for n in lens]
        for o, t in zip(out, nxt):
            o.append(t)
    return out, handoff


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_greedy_tokens_are_identical_with_the_hook_on_and_off(parts, device, dtype):
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (50, 131, 17)]
    eager = [torch.randint(0, 97, (k,), generator=gen).tolist() for k in (4, 1, 9)]
    steps, page = 8, 16
    model = TinyLM(device, dtype)
    off, on = (Server(parts, device, dtype, page, model.layers, model.hq, model.hkv, model.d) for _ in range(2))
    place_requests([off, on], [len(p) + len(e) + steps for p, e in zip(prompts, eager)], page, seed=5)
    attn = recorder()
    tokens_off, logits_off = greedy_after_handoff(model, off, None, prompts, eager, steps)
    tokens_on, logits_on = greedy_after_handoff(model, on, attn, prompts, eager, steps)
    assert attn.records == [("kernel", "")]  # the hooked run really took the kernel
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(logits_on, logits_off, rtol=rtol * 10, atol=atol * 10 * logits_off.abs().max().item())
    assert tokens_on == tokens_off
