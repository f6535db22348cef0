"""Byte layout of a packed KV staging buffer, identical on the packing (P) and unpacking (MD) side.

One flat uint8 buffer per request transfer:

    [K data][V data]                          plain: element dtype of the pool
    [K data][V data][K scales][V scales]      fp8:   e4m3 data, fp32 scale per (layer, token, head)

Each data region is [layer][token][heads * head_dim] (token = position in the slot list, not the slot
number), so both sides only need the same geometry and token count, never each other's slot numbers.
Regions start at 16-byte boundaries.

An MLA pool (DeepSeek-style latent KV: one buffer per layer, no K/V split) packs as K alone: its latent
rows `[kv_lora_rank | qk_rope_head_dim]` are the K region (one "head" of that width, so fp8 keeps one
scale per (layer, token)), and the V region is empty (`v_heads = v_head_dim = 0`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
ALIGN = 16
PACKABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}

Kind = Literal["k", "v"]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class PackLayout:
    """Geometry of one packed transfer: `num_tokens` rows of `num_layers` K and V buffers (MLA: K alone,
    `v_heads = v_head_dim = 0`)."""

    num_layers: int
    num_tokens: int
    k_heads: int
    k_head_dim: int
    v_heads: int
    v_head_dim: int
    dtype: torch.dtype
    fp8: bool = False

    @classmethod
    def for_buffers(
        cls, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], num_tokens: int, fp8: bool = False
    ) -> "PackLayout":
        k = k_buffers[0]
        v_heads, v_dim = (v_buffers[0].shape[1], v_buffers[0].shape[2]) if v_buffers else (0, 0)
        return cls(len(k_buffers), num_tokens, k.shape[1], k.shape[2], v_heads, v_dim, k.dtype, fp8)

    @property
    def latent(self) -> bool:
        """One buffer per layer (MLA): no V region."""
        return self.v_heads == 0

    def row(self, kind: Kind) -> int:
        return self.k_heads * self.k_head_dim if kind == "k" else self.v_heads * self.v_head_dim

    def heads(self, kind: Kind) -> int:
        return self.k_heads if kind == "k" else self.v_heads

    @property
    def elem_bytes(self) -> int:
        return 1 if self.fp8 else self.dtype.itemsize

    def data_elems(self, kind: Kind) -> int:
        return self.num_layers * self.num_tokens * self.row(kind)

    def scale_elems(self, kind: Kind) -> int:
        return self.num_layers * self.num_tokens * self.heads(kind) if self.fp8 else 0

    @cached_property
    def offsets(self) -> dict[str, int]:
        """Byte offset of each region (k_data, v_data, k_scale, v_scale) and the end."""
        k_data = 0
        v_data = _align(k_data + self.data_elems("k") * self.elem_bytes)
        k_scale = _align(v_data + self.data_elems("v") * self.elem_bytes)
        v_scale = _align(k_scale + self.scale_elems("k") * 4)
        end = v_scale + self.scale_elems("v") * 4
        return {"k_data": k_data, "v_data": v_data, "k_scale": k_scale, "v_scale": v_scale, "end": end}

    @property
    def nbytes(self) -> int:
        """Size of the staging buffer (what crosses the WAN)."""
        return self.offsets["end"]

    def gaps(self) -> list[tuple[int, int]]:
        """Alignment padding between regions as [start, end) byte ranges (packers zero them)."""
        o = self.offsets
        ends = [o["k_data"] + self.data_elems("k") * self.elem_bytes,
                o["v_data"] + self.data_elems("v") * self.elem_bytes,
                o["k_scale"] + self.scale_elems("k") * 4]
        starts = [o["v_data"], o["k_scale"], o["v_scale"]]
        return [(e, s) for e, s in zip(ends, starts) if s > e]

    @property
    def raw_bytes(self) -> int:
        """Bytes of the same rows unpacked in the pool's dtype (what page-by-page transfer moves)."""
        size = self.dtype.itemsize
        return (self.data_elems("k") + self.data_elems("v")) * size

    @property
    def kv_adjacent(self) -> bool:
        """K and V rows have one width and V's regions follow K's without padding, so the packed data
        (and fp8 scales) read as one [2 x layer][token][row] region: one kernel launch moves both."""
        o = self.offsets
        return (not self.latent and self.row("k") == self.row("v") and self.k_heads == self.v_heads
                and o["v_data"] == self.data_elems("k") * self.elem_bytes
                and (not self.fp8 or o["v_scale"] == o["k_scale"] + self.scale_elems("k") * 4))

    def data_view(self, packed: torch.Tensor, kind: Kind) -> torch.Tensor:
        """The data region of `kind` as a flat tensor (pool dtype, or uint8 holding e4m3 when fp8)."""
        start = self.offsets[f"{kind}_data"]
        nbytes = self.data_elems(kind) * self.elem_bytes
        region = packed[start : start + nbytes]
        return region if self.fp8 else region.view(self.dtype)

    def scale_view(self, packed: torch.Tensor, kind: Kind) -> torch.Tensor:
        """The fp32 scale region of `kind` (fp8 layouts only)."""
        if not self.fp8:
            raise ValueError("scale_view: layout is not fp8")
        start = self.offsets[f"{kind}_scale"]
        return packed[start : start + self.scale_elems(kind) * 4].view(torch.float32)

    def to_dict(self) -> dict[str, Any]:
        """Named fields for a wire message (the receiver rebuilds the layout and checks its own geometry)."""
        return {"num_layers": self.num_layers, "num_tokens": self.num_tokens, "k_heads": self.k_heads,
                "k_head_dim": self.k_head_dim, "v_heads": self.v_heads, "v_head_dim": self.v_head_dim,
                "dtype": _DTYPE_NAMES[self.dtype], "fp8": self.fp8}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PackLayout":
        names = {v: k for k, v in _DTYPE_NAMES.items()}
        return cls(int(d["num_layers"]), int(d["num_tokens"]), int(d["k_heads"]), int(d["k_head_dim"]),
                   int(d["v_heads"]), int(d["v_head_dim"]), names[d["dtype"]], bool(d["fp8"]))
