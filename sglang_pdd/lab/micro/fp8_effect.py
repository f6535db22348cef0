"""Measure what the opt-in fp8 KV packing does to model output, before anyone enables it.

    python -m sglang_pdd.lab.micro.fp8_effect                         # synthetic + tiny model if built
    python -m sglang_pdd.lab.micro.fp8_effect --model DIR --prompts 8 --prompt-len 2000 --steps 32

fp8 packing only touches the KV that crosses the WAN (MD's missed prefix); the handoff tokens and
everything MD decodes afterwards are computed locally at full precision. Both parts mirror that:

  synthetic   K/V with outlier channels (as real K after RoPE has), 4K prefix, k = 8 new tokens:
              relative error of the KV and of the handoff attention output (torch reference).
  model       a Hugging Face causal LM (default: the tiny test model under .artifacts, if built):
              prefill each prompt, round-trip the whole prompt's KV cache through the packing
              quantizer (`quantize_fp8_blocks`, the kernel's arithmetic), then greedy-decode `steps`
              tokens from the exact and from the quantized cache; report first-step logit error,
              argmax agreement and how many greedy tokens match before the first divergence.

A random-weight model has flat logits, so its argmax flips more easily than a trained model's: treat its
token agreement as a pessimistic bound and repeat the model part on the real model before enabling fp8.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import logging
import os
import sys
from typing import Any

import torch

from sglang_pdd.kernels.handoff_attention_ref import handoff_attention_ref
from sglang_pdd.kernels.kv_pack_ref import dequantize_fp8_blocks, quantize_fp8_blocks

logger = logging.getLogger(__name__)


def roundtrip(x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_fp8_blocks(x)
    return dequantize_fp8_blocks(q, scale, x.dtype)


def synthetic(prefix: int = 4096, k: int = 8, hq: int = 32, hkv: int = 8, dim: int = 128,
              seed: int = 0) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    n = prefix + k
    keys = torch.randn((n, hkv, dim), generator=gen)
    keys[..., :4] *= 20.0  # outlier channels
    values = torch.randn((n, hkv, dim), generator=gen)
    q = torch.randn((k, hq, dim), generator=gen)
    r2t = torch.arange(n, dtype=torch.int32)[None, :]
    exact = torch.empty((k, hq, dim))
    handoff_attention_ref(q, keys, values, exact, r2t, [0], [prefix], [k], dim**-0.5)
    kq, vq = keys.clone(), values.clone()
    kq[:prefix], vq[:prefix] = roundtrip(keys[:prefix]), roundtrip(values[:prefix])  # only the WAN part
    approx = torch.empty_like(exact)
    handoff_attention_ref(q, kq, vq, approx, r2t, [0], [prefix], [k], dim**-0.5)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    return {"k_rel_err": rel(kq[:prefix], keys[:prefix]), "v_rel_err": rel(vq[:prefix], values[:prefix]),
            "attn_rel_err": rel(approx, exact), "attn_max_abs_err": float((approx - exact).abs().max())}


def _cache_roundtrip(cache: Any) -> Any:
    """Quantize every layer's K and V of a transformers cache in place (both cache APIs)."""
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            layer.keys = roundtrip(layer.keys)
            layer.values = roundtrip(layer.values)
    else:
        for i in range(len(cache.key_cache)):
            cache.key_cache[i] = roundtrip(cache.key_cache[i])
            cache.value_cache[i] = roundtrip(cache.value_cache[i])
    return cache


def _greedy(model: Any, cache: Any, first_logits: torch.Tensor, steps: int) -> list[int]:
    tokens = [int(first_logits.argmax())]
    for _ in range(steps - 1):
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@torch.no_grad()
def model_effect(model_dir: str, prompts: int, prompt_len: int, steps: int, seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    per_prompt = []
    for _ in range(prompts):
        ids = torch.randint(300, vocab, (1, prompt_len), generator=gen)
        out = model(ids[:, :-1], use_cache=True)
        exact_cache = out.past_key_values
        quant_cache = _cache_roundtrip(copy.deepcopy(exact_cache))
        # the last prompt token plays the handoff: computed on MD over the (maybe quantized) prefix
        exact = model(ids[:, -1:], past_key_values=exact_cache, use_cache=True)
        quant = model(ids[:, -1:], past_key_values=quant_cache, use_cache=True)
        le, lq = exact.logits[0, -1], quant.logits[0, -1]
        a = _greedy(model, exact.past_key_values, le, steps)
        b = _greedy(model, quant.past_key_values, lq, steps)
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), steps)
        top2 = le.topk(2).values
        per_prompt.append({"logit_max_abs_err": float((le - lq).abs().max()),
                           "logit_rel_err": float((le - lq).norm() / le.norm()),
                           "top1_margin": float(top2[0] - top2[1]),
                           "argmax_equal": bool(le.argmax() == lq.argmax()), "greedy_prefix_match": same})
    return {"model": os.path.basename(model_dir.rstrip("/")), "prompts": prompts, "prompt_len": prompt_len,
            "steps": steps, "per_prompt": per_prompt,
            "argmax_agreement": sum(p["argmax_equal"] for p in per_prompt) / prompts,
            "full_greedy_match": sum(p["greedy_prefix_match"] == steps for p in per_prompt) / prompts}


def _default_model() -> str | None:
    root = os.environ.get("SGLANG_PDD_ARTIFACTS", os.path.join(os.getcwd(), ".artifacts"))
    found = sorted(glob.glob(os.path.join(root, "models", "tiny-llama-*")))
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: the tiny test model, if built)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    result: dict[str, Any] = {"synthetic": synthetic(seed=args.seed)}
    s = result["synthetic"]
    print(f"synthetic (4K prefix, k=8, outlier channels): KV rel err K {s['k_rel_err']:.4f} V {s['v_rel_err']:.4f}; "
          f"attention rel err {s['attn_rel_err']:.4f} (max abs {s['attn_max_abs_err']:.4f})")
    model_dir = args.model or _default_model()
    if model_dir is None:
        print("model part skipped: no --model and no tiny model under .artifacts/models")
    else:
        m = model_effect(model_dir, args.prompts, args.prompt_len, args.steps, args.seed)
        result["model"] = m
        print(f"model {m['model']}: {m['prompts']} prompts x {m['prompt_len']} tokens, {m['steps']} greedy steps")
        for i, p in enumerate(m["per_prompt"]):
            print(f"  prompt {i}: logit max abs err {p['logit_max_abs_err']:.4f} (rel {p['logit_rel_err']:.4f}, "
                  f"top-1 margin {p['top1_margin']:.4f}), argmax equal {p['argmax_equal']}, "
                  f"greedy tokens equal before first divergence {p['greedy_prefix_match']}/{m['steps']}")
        print(f"  argmax agreement {m['argmax_agreement']:.0%}, full greedy match {m['full_greedy_match']:.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
