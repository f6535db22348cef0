"""A tiny Llama whose greedy output depends on its whole context, and a locally trained tokenizer.

    python -m sglang_pdd.lab.testing.tiny_model OUT_DIR [--layers 4 --hidden 512 --heads 8 --kv-heads 8 ...]
    python -m sglang_pdd.lab.testing.tiny_model OUT_DIR --arch mla   # DeepSeek-V3 MLA (tiny_mla)

Nothing is downloaded: the byte-level BPE tokenizer is trained on a seeded synthetic corpus, the
weights are constructed from a seed (sglang_pdd.lab.testing.context_model: read heads that each attend to
exactly one earlier position, random mixing, confident greedy steps). `--weights random` builds the
earlier random-init model instead, whose outputs are mostly one token repeated (kept only to show what a
test model that ignores its context cannot prove). The same options always give the same files, so the
model is rebuilt rather than shipped. sglang and transformers both load the directory.

The default is sized for the CPU testbed: 16 KiB of KV per token (4 layers x 8 KV heads x 64 x K,V x
fp32, inside the 10-80 KB/token of real models, so a few-thousand-token prompt is tens of MB and a
WAN transfer takes seconds), while a 2K-token prefill stays around half a second to a second on
2 CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass

from sglang_pdd.lab.testing.chat_templates import CHAT_TEMPLATE, MARKUP_TOKENS, with_plain_markup
from sglang_pdd.lab.testing.context_model import ContextWeights, construct

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
# then the tool/reasoning markers (chat_templates: added tokens, not special); none is ever a greedy choice
RESERVED_TOKENS = SPECIAL_TOKENS + MARKUP_TOKENS
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
WEIGHTS = ("context", "random")
ARCHS = ("llama", "mla")  # mla: DeepSeek-V3 attention with a latent KV (sglang_pdd.lab.testing.tiny_mla)


@dataclass(frozen=True)
class TinyModelSpec:
    layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    intermediate: int = 1024
    vocab: int = 2048
    max_positions: int = 32768
    dtype: str = "float32"
    seed: int = 0
    weights: str = "context"  # context (sglang_pdd.lab.testing.context_model) | random (torch's init)
    arch: str = "llama"  # llama (MHA) | mla (head_dim is then the rope, nope and v head dims)
    kv_lora_rank: int = 512  # mla only: the latent KV's width (cached per token beside head_dim of k_rope); 512
    # carries the 511 content channels of the residual: 38/40 one-token perturbations change the output (256: 35/40)

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_BYTES)}, got {self.dtype!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")
        if self.vocab < 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab must be at least {256 + len(SPECIAL_TOKENS)} (byte-level BPE)")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.arch == "mla" and self.kv_heads != self.heads:
            raise ValueError(f"arch mla has one latent KV for all heads: kv_heads ({self.kv_heads}) must equal "
                             f"heads ({self.heads})")

    @property
    def kv_bytes_per_token(self) -> int:
        if self.arch == "mla":  # one row per layer: the latent and k_rope
            return self.layers * (self.kv_lora_rank + self.head_dim) * _DTYPE_BYTES[self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype]

    def fingerprint(self) -> str:
        fields = asdict(self)
        if self.arch == "llama":  # the MHA model's fingerprint (and cache directory) predate these fields
            del fields["arch"], fields["kv_lora_rank"]
        parts = [f"{v}" for v in fields.values()]
        if self.weights == "context":  # the construction's knobs and version are part of the model
            parts.append(hashlib.sha256(repr(ContextWeights()).encode()).hexdigest()[:8])
        parts.append(hashlib.sha256(repr((RESERVED_TOKENS, CHAT_TEMPLATE)).encode()).hexdigest()[:8])  # the tokenizer
        return "-".join(parts)


def _corpus(seed: int, lines: int = 6000) -> list[str]:
    """Seeded pseudo-text: syllable words, numbers, a little JSON and code, like agent traffic."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "x"]
    words = list({"".join(rng.choice(p) for p in (onsets, vowels, codas, onsets, vowels)) for _ in range(3000)})
    words.sort()
    out = []
    for _ in range(lines):
        kind = rng.random()
        ws = rng.choices(words, k=rng.randint(4, 16))
        if kind < 0.7:
            out.append(" ".join(ws).capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind < 0.85:
            out.append(json.dumps({ws[0]: rng.randint(0, 9999), ws[1]: ws[2:5]}))
        else:
            out.append(f"def {ws[0]}_{ws[1]}({ws[2]}, {ws[3]}):\n    return {ws[2]} + {rng.randint(0, 99)}")
    return out


def build_tokenizer(spec: TinyModelSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        special_tokens=RESERVED_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    return with_plain_markup(tok)


def build(out_dir: str, spec: TinyModelSpec = TinyModelSpec()) -> dict:
    """Write the model and tokenizer into `out_dir`; return a summary (config + KV bytes/token)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(spec)
    vocab = tok.get_vocab_size()
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out_dir)

    if spec.arch == "mla":
        from sglang_pdd.lab.testing import tiny_mla

        model = tiny_mla.model(spec, vocab, tok.token_to_id("<s>"), tok.token_to_id("</s>"), len(RESERVED_TOKENS))
        return _save(out_dir, spec, model, vocab, t0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        torch_dtype=spec.dtype,
        rope_parameters={"rope_theta": ContextWeights().rope_theta, "rope_type": "default"},
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    if spec.weights == "context":
        state = construct(config, ContextWeights(), spec.seed, special_tokens=len(RESERVED_TOKENS))
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return _save(out_dir, spec, model, vocab, t0)


def _save(out_dir: str, spec: TinyModelSpec, model, vocab: int, t0: float) -> dict:
    import torch

    model = model.to(getattr(torch, spec.dtype)).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    summary = {
        "out_dir": out_dir,
        "spec": asdict(spec),
        "vocab_size": vocab,
        "parameters": sum(p.numel() for p in model.parameters()),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "build_s": round(time.monotonic() - t0, 1),
    }
    with open(os.path.join(out_dir, "sglang_pdd_tiny_model.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def build_cached(cache_root: str, spec: TinyModelSpec = TinyModelSpec()) -> str:
    """Build once per spec under `cache_root`; return the model directory."""
    out = os.path.join(cache_root, f"tiny-{spec.arch}-{spec.fingerprint()}")
    marker = os.path.join(out, "sglang_pdd_tiny_model.json")
    if not os.path.exists(marker):
        tmp = out + f".tmp{os.getpid()}"
        build(tmp, spec)
        os.replace(tmp, out) if not os.path.exists(out) else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_pdd.lab.testing.tiny_model", description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    d = TinyModelSpec()
    for name, default in asdict(d).items():
        kw = {"dtype": {"choices": sorted(_DTYPE_BYTES)}, "weights": {"choices": WEIGHTS},
              "arch": {"choices": ARCHS}}.get(name, {})
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default, **kw)
    args = p.parse_args(argv)
    spec = TinyModelSpec(**{k: getattr(args, k) for k in asdict(d)})
    summary = build(args.out_dir, spec)
    print(json.dumps(summary, indent=2))
    print(f"KV bytes/token: {summary['kv_bytes_per_token']} ({summary['kv_bytes_per_token'] / 1024:.1f} KiB); "
          f"{summary['parameters'] / 1e6:.1f}M parameters; built in {summary['build_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
