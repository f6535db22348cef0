"""Triton kernels of the handoff attention: a split-KV partial pass and its reduction.

The handoff EXTEND on MD runs k new query tokens (1 to a few hundred) per request against a prefix of tens
of thousands of cached tokens. A generic extend kernel gives each program a tile of queries and walks the
whole prefix, so with small k only a handful of programs exist. Here the KV range of every request is cut
into partitions of `split_len` positions (flash-decoding style); each program computes a partial softmax of
one (query tile, partition, request, KV head) and a second kernel merges the partitions. The blocks
wholly inside the prefix (all but the last one or two of a partition) run without masks, so the
software pipeliner sees a plain loop of loads and two `tl.dot`s (wgmma on sm_90).

GQA: a program serves all G = Hq / Hkv query heads of one KV head, so every K/V block is read once per KV
head. Its BLOCK_M rows are (token, head) pairs, token-major: row r holds token t0 + r // G and query head
kv_head * G + r % G.

Both K/V of the prefix and of the k new tokens are read from sglang's token pool through `req_to_token`
(the backend stores the new tokens' K/V before attention runs), so positions [0, prefix + k) of a request
are one address space; query i of a request sits at position prefix + i and sees positions <= its own.

Only imported lazily, by `handoff_attention.py`, so `sglang_pdd.kernels` imports without triton.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attend_block(acc, l_i, m_i, q, start, K_Buf, V_Buf, r2t_row, kv_head, kv_end, q_pos, offs_n, offs_d, offs_dv,
                  d_ok, dv_ok, sm_scale_log2, stride_kbs, stride_kh, stride_vbs, stride_vh,
                  BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, EVEN_D: tl.constexpr,
                  MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One BLOCK_N step of the online softmax. MASKED: the block may reach past kv_end or past a query's
    own position (the causal part); unmasked blocks lie wholly in the prefix every query sees."""
    pos = start + offs_n
    pos_ok = pos < kv_end
    # sglang's paged allocator keeps a page's slots consecutive and page aligned
    # (slot % PAGE_SIZE == position % PAGE_SIZE): one index per page suffices.
    in_page = pos % PAGE_SIZE
    if MASKED:
        slot = tl.load(r2t_row + (pos - in_page), mask=pos_ok, other=0).to(tl.int64) + in_page
    else:
        slot = tl.load(r2t_row + (pos - in_page)).to(tl.int64) + in_page
    k_ptrs = K_Buf + slot[None, :] * stride_kbs + kv_head * stride_kh + offs_d[:, None]
    v_ptrs = V_Buf + slot[:, None] * stride_vbs + kv_head * stride_vh + offs_dv[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=pos_ok[None, :] & d_ok[:, None], other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
    qk = tl.dot(q, k, input_precision=INPUT_PRECISION) * sm_scale_log2
    if MASKED:
        keep = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        qk = tl.where(keep, qk, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)

    if MASKED:
        v = tl.load(v_ptrs, mask=pos_ok[:, None] & dv_ok[None, :], other=0.0)
    elif EVEN_D:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def handoff_attn_partial_kernel(
    Q,
    K_Buf,
    V_Buf,
    Out,
    Mid_O,
    Mid_Lse,
    Req_To_Token,
    Req_Pool_Idx,
    Prefix_Lens,
    Extend_Lens,
    Qo_Indptr,
    sm_scale_log2,
    split_len,
    n_kv_heads,
    stride_qt,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    stride_r2t,
    G: tl.constexpr,
    TOK_PER_TILE: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # Grid (query tile, partition, request x KV head): the query tiles of one partition are neighbours in
    # launch order, so they run together and all but the first read that partition's K/V from L2.
    qt = tl.program_id(0)
    split = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // n_kv_heads
    kv_head = pid_bh % n_kv_heads

    ext_len = tl.load(Extend_Lens + b).to(tl.int32)
    t0 = qt * TOK_PER_TILE
    if t0 >= ext_len:
        return
    prefix = tl.load(Prefix_Lens + b).to(tl.int32)
    # Causal end of this tile: its last token sees positions < prefix + t_last + 1.
    tile_kv_end = prefix + tl.minimum(t0 + TOK_PER_TILE, ext_len)
    kv_start = split * split_len
    if kv_start >= tile_kv_end:
        return
    kv_end = tl.minimum(kv_start + split_len, tile_kv_end)
    # Whole blocks below the prefix (every query of the tile sees them) need no mask; the rest do.
    full_end = kv_start + tl.maximum(tl.minimum(kv_end, prefix) - kv_start, 0) // BLOCK_N * BLOCK_N

    q_start = tl.load(Qo_Indptr + b).to(tl.int64)
    req_row = tl.load(Req_Pool_Idx + b).to(tl.int64)

    rows = tl.arange(0, BLOCK_M)
    tok = t0 + rows // G
    head = kv_head * G + rows % G
    row_ok = (rows < TOK_PER_TILE * G) & (tok < ext_len)
    q_pos = prefix + tok

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    EVEN_D: tl.constexpr = (BLOCK_D == D) and (BLOCK_DV == DV)

    q_ptrs = Q + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Finite start for the running max: a row whose keys are all masked in a block keeps p = 0 and
    # alpha = 1 instead of producing exp(-inf - -inf) = NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    r2t_row = Req_To_Token + req_row * stride_r2t
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(kv_start, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, start, K_Buf, V_Buf, r2t_row, kv_head, kv_end, q_pos,
                                      offs_n, offs_d, offs_dv, d_ok, dv_ok, sm_scale_log2, stride_kbs, stride_kh,
                                      stride_vbs, stride_vh, BLOCK_N, PAGE_SIZE, EVEN_D, False, INPUT_PRECISION)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, start, K_Buf, V_Buf, r2t_row, kv_head, kv_end, q_pos,
                                      offs_n, offs_d, offs_dv, d_ok, dv_ok, sm_scale_log2, stride_kbs, stride_kh,
                                      stride_vbs, stride_vh, BLOCK_N, PAGE_SIZE, EVEN_D, True, INPUT_PRECISION)

    # Rows with no visible key in this partition (l = 0) are never read back by the reduction.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    store_ok = row_ok[:, None] & dv_ok[None, :]
    t_glob = q_start + tok
    if DIRECT_OUT:
        o_ptrs = Out + t_glob[:, None] * stride_ot + head[:, None] * stride_oh + offs_dv[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=store_ok)
    else:
        mo_ptrs = Mid_O + t_glob[:, None] * stride_mt + head[:, None] * stride_mh + split * stride_ms
        tl.store(mo_ptrs + offs_dv[None, :], out, mask=store_ok)
        lse = m_i + tl.math.log2(l_safe)
        tl.store(Mid_Lse + t_glob * stride_lt + head * stride_lh + split, lse, mask=row_ok)


@triton.jit
def handoff_attn_reduce_kernel(
    Out,
    Mid_O,
    Mid_Lse,
    Prefix_Lens,
    Extend_Lens,
    Qo_Indptr,
    split_len,
    stride_ot,
    stride_oh,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Merge the partitions of one (token, query head): the log2-sum-exp weighted mean of partials."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    head = tl.program_id(2)
    ext_len = tl.load(Extend_Lens + b).to(tl.int32)
    if i >= ext_len:
        return
    prefix = tl.load(Prefix_Lens + b).to(tl.int32)
    t_glob = tl.load(Qo_Indptr + b).to(tl.int64) + i
    # Partitions holding at least one position this token sees: exactly those the partial pass wrote
    # a row for (partition s starts at s * split_len <= prefix + i).
    n_valid = tl.cdiv(prefix + i + 1, split_len)

    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    mo_base = Mid_O + t_glob * stride_mt + head * stride_mh
    lse_base = Mid_Lse + t_glob * stride_lt + head * stride_lh

    m = tl.full((), -1.0e30, dtype=tl.float32)
    denom = tl.zeros((), dtype=tl.float32)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s in range(0, n_valid):
        lse = tl.load(lse_base + s)
        part = tl.load(mo_base + s * stride_ms + offs_dv, mask=dv_ok, other=0.0)
        m_new = tl.maximum(m, lse)
        scale_old = tl.math.exp2(m - m_new)
        w = tl.math.exp2(lse - m_new)
        acc = acc * scale_old + w * part
        denom = denom * scale_old + w
        m = m_new
    out = acc / denom
    tl.store(Out + t_glob * stride_ot + head * stride_oh + offs_dv, out.to(Out.dtype.element_ty), mask=dv_ok)
