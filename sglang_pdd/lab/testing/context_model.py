"""Constructed weights for the tiny test Llama: every greedy token depends on the whole context.

A random-weight Llama answers most prompts with one token repeated, so a wrong page, position or slot of
KV gives the same output as the right one. These weights make the model a deterministic, chaotic function
of its context with confident (large-margin) greedy steps, built in seconds without training:

* **Read heads.** Every attention head reads exactly one earlier position at a fixed distance. Layer 0
  reads the neighbourhood (distances 0, 8, ..., 56), so each position's residual carries its
  neighbours' tokens; the 24 heads of layers 1-3 read distances spread over [0, 2048) (0, 85, 171, ...,
  1963, interleaved across layers). A token at distance D from the prompt's end is then seen, directly
  or through a neighbour, in many of the first 64 decode steps, by some head of some layer. q and k
  come only from a constant channel of the residual stream (hidden dimension 0, which the embedding
  sets to a large constant and nothing else writes), so the score is a function of m - n alone, shaped
  through RoPE: score(m - n) = A * sum_f Re(z_f * exp(i theta_f (m - n))). The complex amplitudes z_f
  are the solution of a small linear program (scipy's HiGHS): the score at m - n = d beats every other
  distance up to `span` by `gap`, and where m - d does not exist yet (a short prompt), the score of the
  query's own position (m - n = 0) beats every other by the same gap. With a gap of 25 logits the
  softmax is one-hot to 1e-11: a head's output is the value at one position, so float reordering
  cannot move attention weights, and every layer's K and V of every position matters (a wrong page
  shows).
* **Values and mixing.** v and o are random maps of the content dimensions (1..hidden-1); reads of
  later layers carry the reads earlier layers wrote at the position they read, so the residual holds
  thousands of read paths through the context. A random gated MLP with gain mixes them nonlinearly.
* **Readout.** A random lm_head over the content dimensions; the special tokens' rows are zero, so EOS
  and the chat markers are never greedy choices (outputs run to max_new_tokens).

`tests/unit/lab/testing/test_tiny_model_sensitivity.py` pins what this buys (distinct tokens per output, share of
single-token perturbations that change the output, logit noise between orderings vs greedy margins).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ContextWeights:
    """The construction's knobs (part of the model's cache fingerprint through TinyModelSpec)."""

    gap: float = 25.0  # score margin of the read position over every other, in softmax logits
    constant: float = 100.0  # the constant channel's value, in units of the content's RMS
    read_gain: float = 1.0  # a layer's reads add this much (RMS ratio) to the residual's content
    mlp_gain: float = 1.0  # likewise for each MLP
    reach: int = 2048  # layers 1.. read distances spread evenly over [0, reach)
    local: int = 64  # layer 0 reads distances below this
    span: int = 8192  # distances the attention kernel is shaped for (longer contexts stay defined, less sharp)
    rope_theta: float = 10000.0


def read_offsets(layers: int, heads: int, reach: int, local: int) -> list[list[tuple[int, ...]]]:
    """[layer][head] -> the distances the head reads. Layer 0 reads the neighbourhood (distances 0, local/heads,
    ... < local), so every position's residual carries its neighbours' tokens; the heads of the later layers
    read far distances spread evenly over [0, reach), interleaved across layers. A far head at distance d
    then sees a token at distance D in the decode steps where d - step lies in [D - local, D]: a token is
    visible at many steps, not only at the one step where a head reads it directly."""
    near = [tuple([i * (local // heads)]) for i in range(heads)]
    n_far = (layers - 1) * heads
    stride = reach / n_far
    out = [near]
    for l in range(1, layers):
        out.append([])
        for h in range(heads):
            k = (layers - 1) * h + (l - 1)
            out[-1].append((int(round(k * stride)),))
    return out


def prompt_positions_read(prompt_len: int, decode_steps: int, layers: int, heads: int,
                          w: ContextWeights | None = None) -> set[int]:
    """The prompt positions whose cached KV a decoder reads in `decode_steps` decode steps after a prompt
    of `prompt_len` tokens (queries at positions prompt_len, prompt_len + 1, ...). Every head reads one
    position, `q - d`, or its own where `q - d` is before the context; the KV the decoder writes itself
    (positions >= prompt_len) is left out. A page of the prompt holding none of these positions may be
    missing or wrong in a decoder's cache without changing its output: a negative control that withholds
    such a page cannot fail (e.g. page 0 of 64 tokens under a 150-token prompt and 15 steps: layer 0 reads
    back less than 64, the nearest far distances are 85 and 171)."""
    w = w or ContextWeights()
    offsets = read_offsets(layers, heads, w.reach, w.local)
    out: set[int] = set()
    for q in range(prompt_len, prompt_len + decode_steps):
        for layer in offsets:
            for peaks in layer:
                for d in peaks:
                    p = q - d if q - d >= 0 else q
                    if p < prompt_len:
                        out.add(p)
    return out


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    return np.array([theta ** (-2 * f / head_dim) for f in range(head_dim // 2)], dtype=np.float64)


def kernel(freqs: np.ndarray, peaks: tuple[int, ...], span: int) -> tuple[np.ndarray, float]:
    """Complex amplitudes z (len(freqs)) with score(delta) = sum Re(z exp(i freqs delta)) equal to 1 at
    every distance of `peaks` and below it by the returned gap at every other distance in [0, span];
    while no peak lies inside the context yet, delta = 0 (the query's own position) wins by the same gap.
    z_f = sum_p b_pf exp(-i freqs_f peak_p) + c_f with b, c >= 0, found by a linear program, solved on a
    growing subset of the distances (cutting planes)."""
    from scipy.optimize import linprog

    n_f = len(freqs)
    deltas = np.arange(0, span + 1)
    basis = [np.cos(np.outer(deltas - d, freqs)) for d in peaks] + [np.cos(np.outer(deltas, freqs))]
    scores = np.hstack(basis)  # score(delta) = scores[delta] @ x
    others = np.setdiff1d(deltas, peaks)
    first = min(peaks)
    rows = [scores[d] - scores[others] for d in peaks]
    if first > 1:  # no peak inside the context yet: the query's own position wins
        rows.append(scores[0] - scores[1:first])
    margins = np.vstack(rows)
    n = scores.shape[1]
    objective = np.zeros(n + 1)
    objective[-1] = -1.0  # maximise the smallest margin t
    a_eq = np.hstack([scores[list(peaks)], np.zeros((len(peaks), 1))])
    active = np.unique(np.concatenate([np.arange(min(512, len(margins))), np.arange(0, len(margins), 16)]))
    for _ in range(50):
        sub = margins[active]
        res = linprog(objective, A_ub=np.hstack([-sub, np.ones((len(sub), 1))]), b_ub=np.zeros(len(sub)),
                      A_eq=a_eq, b_eq=np.ones(len(peaks)), bounds=[(0, None)] * n + [(None, None)],
                      method="highs")
        if not res.success:
            raise RuntimeError(f"attention kernel for peaks {peaks}: {res.message}")
        got = margins @ res.x[:n]
        violated = np.flatnonzero(got < res.x[-1] * (1 - 1e-9))
        if not len(violated):
            break
        active = np.union1d(active, violated[np.argsort(got[violated])[:256]])
    x = res.x[:n]
    z = x[-n_f:].astype(complex)
    for i, d in enumerate(peaks):
        z = z + x[i * n_f:(i + 1) * n_f] * np.exp(-1j * freqs * d)
    return z, float(got.min())


def construct(cfg, w: ContextWeights, seed: int, special_tokens: int) -> dict:
    """The state dict of a `LlamaForCausalLM(cfg)` (`cfg.rope_theta == w.rope_theta`); token IDs below
    `special_tokens` are never predicted."""
    import torch

    d, heads, kv_heads, hd, layers, inter, vocab = (
        cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers,
        cfg.intermediate_size, cfg.vocab_size)
    randn, sd, content, const = seeded_embedding(seed, vocab, d, w)
    freqs = rope_frequencies(hd, w.rope_theta)
    offsets = read_offsets(layers, heads, w.reach, w.local)
    var = 1.0  # mean square of a content entry of the residual
    for l in range(layers):
        p = f"model.layers.{l}."
        rms = math.sqrt((const * const + var * content) / d)
        x0 = const / rms  # the constant channel after RMSNorm
        wq = torch.zeros(heads * hd, d, dtype=torch.float64)
        wk, wv = (torch.zeros(kv_heads * hd, d, dtype=torch.float64) for _ in range(2))
        wo = torch.zeros(d, heads * hd, dtype=torch.float64)
        for h, off in enumerate(offsets[l]):
            z, gap = kernel(freqs, off, w.span)  # off: the distances this head reads
            amp = w.gap / gap * math.sqrt(hd)  # sglang and HF scale scores by 1/sqrt(head_dim)
            rows = slice(h * hd, (h + 1) * hd)
            q = np.concatenate([z.real, z.imag]) * amp  # neox RoPE: dims f and f + hd/2 are one complex pair
            wq[rows, 0] = torch.from_numpy(q) / x0
            wo[1:, rows] = randn(content, hd) * (w.read_gain / math.sqrt(hd * heads))
        for h in range(kv_heads):  # k is the same for every head: the score depends on distance alone
            rows = slice(h * hd, (h + 1) * hd)
            wk[rows, 0] = torch.from_numpy(np.concatenate([np.ones(hd // 2), np.zeros(hd // 2)])) / x0
            wv[rows, 1:] = randn(hd, content) * (rms / math.sqrt(content))  # v entries ~ N(0, var)
        sd.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                   p + "self_attn.v_proj.weight": wv, p + "self_attn.o_proj.weight": wo,
                   p + "input_layernorm.weight": torch.ones(d, dtype=torch.float64),
                   p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.float64)})
        var = mlp_layer(sd, p, randn, w, d, inter, content, const, var)
    return final_norm_and_head(sd, randn, d, vocab, content, const, var, special_tokens)


def mlp_layer(sd: dict, p: str, randn, w: "ContextWeights", d: int, inter: int, content: int, const: float,
              var: float) -> float:
    """One layer's MLP (weights into `sd` under prefix `p`), after an attention that read with
    `w.read_gain`: a random map of the content channels, sized so the residual stream's variance grows
    by `w.mlp_gain`**2; returns the variance after it. Shared by the MHA and the MLA test models."""
    import torch

    var *= 1 + w.read_gain ** 2
    rms = math.sqrt((const * const + var * content) / d)
    scale = rms / math.sqrt(content * var)
    gate, up, down = (torch.zeros(inter, d, dtype=torch.float64), torch.zeros(inter, d, dtype=torch.float64),
                      torch.zeros(d, inter, dtype=torch.float64))
    gate[:, 1:] = randn(inter, content) * scale * 2
    up[:, 1:] = randn(inter, content) * scale
    down[1:, :] = randn(content, inter) * (w.mlp_gain * math.sqrt(var) / math.sqrt(inter))
    sd.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": down})
    var *= 1 + w.mlp_gain ** 2
    return var


def final_norm_and_head(sd: dict, randn, d: int, vocab: int, content: int, const: float, var: float,
                        special_tokens: int) -> dict:
    """The final norm and lm_head (logits ~ N(0, 4^2) over the content channels; the special tokens
    never a greedy choice)."""
    import torch

    sd["model.norm.weight"] = torch.ones(d, dtype=torch.float64)
    head = torch.zeros(vocab, d, dtype=torch.float64)
    rms = math.sqrt((const * const + var * content) / d)
    head[:, 1:] = randn(vocab, content) * (4 / math.sqrt(content) * rms / math.sqrt(var))  # logits ~ N(0, 4^2)
    head[:special_tokens] = 0  # never a greedy choice: outputs run to max_new_tokens
    sd["lm_head.weight"] = head
    return sd


def seeded_embedding(seed: int, vocab: int, d: int, w: "ContextWeights"):
    """(randn, state dict, content channels, constant): the seeded float64 generator every later weight
    draws from, and the embedding (channel 0 the constant, the rest N(0, 1) content). Shared by the MHA
    and the MLA test models; the draw order is the models' identity."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    content = d - 1
    const = w.constant * math.sqrt(content)
    emb = torch.zeros(vocab, d, dtype=torch.float64)
    emb[:, 0] = const
    emb[:, 1:] = randn(vocab, content)
    return randn, {"model.embed_tokens.weight": emb}, content, const
