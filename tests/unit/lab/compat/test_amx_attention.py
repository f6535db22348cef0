"""The compat stand-in's torch versions of sgl-kernel's CPU attention ops (sglang's `intel_amx` backend),
called through `torch.ops.sgl_kernel` with the argument order of sglang 0.5.23's call sites, against
plain causal attention over the whole sequence: MHA/GQA rows, MLA latent rows (V a view of K), the
cached prefix read through `req_to_token`, and what is refused."""

import pytest
import torch

from sglang_pdd.lab.compat import amx_attention

torch.manual_seed(0)


def ops():
    import sgl_kernel  # noqa: F401 - the stand-in registers the ops (real sgl-kernel where installed)

    return torch.ops.sgl_kernel


def reference(q, k, v, scale):
    """q [T, H, D] at the last T of S positions, k [S, Hkv, D], v [S, Hkv, Dv]: causal softmax attention."""
    s, t, h = k.shape[0], q.shape[0], q.shape[1]
    k = k.double().repeat_interleave(h // k.shape[1], dim=1)
    v = v.double().repeat_interleave(h // v.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    mask = torch.arange(s)[None, :] > torch.arange(s - t, s)[:, None]
    probs = torch.softmax(scores.masked_fill(mask[None], float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).float()


class Pool:
    """A token pool of `size` rows and a req_to_token table whose requests own scattered rows."""

    def __init__(self, size, k_shape, v_dim, mla):
        self.k = torch.zeros(size, *k_shape)
        self.v = self.k[..., :v_dim] if mla else torch.zeros(size, k_shape[0], v_dim)
        self.req_to_token = torch.zeros(4, 64, dtype=torch.int32)
        self.free = torch.randperm(size - 1)[: 4 * 64].view(4, 64).int() + 1

    def rows(self, req, n):
        self.req_to_token[req, :n] = self.free[req, :n]
        return self.req_to_token[req, :n].long()


@pytest.mark.parametrize("mla", [False, True])
def test_extend_then_decode_equal_attention_over_the_whole_sequence(mla):
    heads = 8
    if mla:  # DeepSeek's absorbed form: one latent row per token, q of the latent's width, v = its first `rank`
        kv_heads, dk, dv = 1, 40, 32
    else:  # GQA
        kv_heads, dk, dv = 2, 16, 16
    pool, scale = Pool(300, (kv_heads, dk), dv, mla), 0.3
    reqs = [(1, 9, 7), (3, 0, 12)]  # (req_to_token row, cached prefix, new tokens)
    seqs = {}
    q_all, k_new, v_new, want = [], [], [], []
    for req, prefix, new in reqs:
        k = torch.randn(prefix + new + 1, kv_heads, dk)
        v = k[..., :dv].clone() if mla else torch.randn(prefix + new + 1, kv_heads, dv)
        q = torch.randn(prefix + new + 1, heads, dk)
        rows = pool.rows(req, prefix + new + 1)
        pool.k[rows[:prefix]] = k[:prefix]
        if not mla:
            pool.v[rows[:prefix]] = v[:prefix]
        pool.k[rows[prefix:prefix + new]] = k[prefix:prefix + new]  # the backend's set_kv_buffer before the op
        if not mla:
            pool.v[rows[prefix:prefix + new]] = v[prefix:prefix + new]
        seqs[req] = (q, k, v, rows)
        q_all.append(q[prefix:prefix + new])
        k_new.append(k[prefix:prefix + new])
        v_new.append(v[prefix:prefix + new])
        want.append(reference(q[prefix:prefix + new], k[:prefix + new], v[:prefix + new], scale))
    q_ext = torch.cat(q_all)
    o = torch.empty(q_ext.shape[0], heads, dv)
    seq_lens = torch.tensor([p + n for _, p, n in reqs])
    ext = torch.tensor([n for _, _, n in reqs])
    start = torch.tensor([0, reqs[0][2]])
    ops().extend_attention_cpu(q_ext, torch.cat(k_new), torch.cat(v_new), o, pool.k, pool.v, 1.0, 1.0,
                               pool.req_to_token, torch.tensor([1, 3]), seq_lens, ext, start, int(ext.max()),
                               scale, 0.0, False, 0, None, None, None, True)
    torch.testing.assert_close(o, torch.cat(want), rtol=1e-4, atol=1e-5)

    # One decode step per request: the op writes the step's K/V at `loc` itself, then attends.
    loc = torch.stack([seqs[r][3][p + n] for r, p, n in reqs])
    qd = torch.stack([seqs[r][0][p + n] for r, p, n in reqs])
    kd = torch.stack([seqs[r][1][p + n] for r, p, n in reqs])
    vd = torch.stack([seqs[r][2][p + n] for r, p, n in reqs])
    od = torch.empty(2, heads, dv)
    ops().decode_attention_cpu(qd, pool.k, pool.v, 1.0, 1.0, od, kd, vd, loc, torch.empty(0), pool.req_to_token,
                               torch.tensor([1, 3]), seq_lens + 1, scale, 0.0, False, 0, None, None)
    torch.testing.assert_close(pool.k[loc], kd)
    torch.testing.assert_close(pool.v[loc], vd)
    for i, (r, p, n) in enumerate(reqs):
        q, k, v, _ = seqs[r]
        torch.testing.assert_close(od[i:i + 1], reference(q[p + n:p + n + 1], k, v, scale), rtol=1e-4, atol=1e-5)


def test_the_mha_prefill_of_an_mla_model_reads_its_new_rows_from_the_arguments():
    """sglang's DeepSeek code runs a prompt with nothing cached as MHA (k and v expanded from the latent,
    not in the cache, whose rows are latents of another width): the op must not read the cache for them."""
    pool = Pool(300, (1, 40), 32, mla=True)
    rows = pool.rows(0, 5)
    pool.k[rows] = float("nan")  # whatever the cache holds there is not read
    q, k, v = torch.randn(5, 4, 24), torch.randn(5, 4, 24), torch.randn(5, 4, 16)
    o = torch.empty(5, 4, 16)
    ops().extend_attention_cpu(q, k, v, o, pool.k, pool.v, 1.0, 1.0, pool.req_to_token, torch.tensor([0]),
                               torch.tensor([5]), torch.tensor([5]), torch.tensor([0]), 5, 0.2, 0.0, False, 0,
                               None, None, None, True)
    torch.testing.assert_close(o, reference(q, k, v, 0.2), rtol=1e-4, atol=1e-5)


def test_a_prefix_of_another_row_width_and_a_tree_mask_are_refused():
    pool = Pool(300, (1, 40), 32, mla=True)
    pool.rows(0, 8)
    q, k, v = torch.randn(3, 4, 24), torch.randn(3, 4, 24), torch.randn(3, 4, 16)
    args = [q, k, v, torch.empty(3, 4, 16), pool.k, pool.v, 1.0, 1.0, pool.req_to_token, torch.tensor([0]),
            torch.tensor([8]), torch.tensor([3]), torch.tensor([0]), 3, 0.2, 0.0, False, 0, None, None, None, True]
    with pytest.raises(ValueError, match="cached prefix of 5 tokens"):
        ops().extend_attention_cpu(*args)
    args[20] = torch.ones(9, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="tree mask"):
        ops().extend_attention_cpu(*args)


def test_the_amx_platform_claim_is_off_unless_asked(monkeypatch):
    calls = []

    class RuntimeContext:
        @staticmethod
        def override_platform(**facts):
            calls.append(facts)
            return type("Override", (), {"install": lambda self: None})()

    monkeypatch.delenv(amx_attention.ENV_AMX_ATTENTION, raising=False)
    amx_attention.claim_amx_attention(RuntimeContext)
    assert calls == []
    monkeypatch.setenv(amx_attention.ENV_AMX_ATTENTION, "1")
    amx_attention.claim_amx_attention(RuntimeContext)
    assert calls == [{"has_amx": True}]
