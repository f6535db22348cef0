"""Test-only fixes for Triton's CPU interpreter (triton 3.8), applied by conftest.py under TRITON_INTERPRET=1.

The interpreter's float downcast (`interpreter._convert_float`) rounds by adding the cut-off bit to the
mantissa without carrying into the exponent, so an fp32 -> e4m3 cast that rounds up across a power of two
comes out halved (127.9 -> 64 instead of 128). GPUs convert correctly (cvt.rn.satfinite.e4m3). The patch
routes float -> float8e4nv casts through torch's correctly rounded conversion; everything else is unchanged.
"""

from __future__ import annotations

import numpy as np
import torch


def patch_fp8_downcast() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._convert_float, "_pdd_patched", False):
        return
    original = interpreter._convert_float
    np_float = {16: np.float16, 32: np.float32}

    def convert(input, input_dtype, output_dtype, rounding_mode):  # noqa: ANN001, ANN202 - interpreter's signature
        if output_dtype == tl.float8e4nv and input_dtype in (tl.float32, tl.float16, tl.bfloat16):
            if input_dtype == tl.bfloat16:
                bits = np.frombuffer(input.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
                values = torch.from_numpy(bits.view(np.float32).copy())
            else:
                values = torch.from_numpy(
                    np.frombuffer(input.tobytes(), dtype=np_float[input_dtype.primitive_bitwidth]).copy())
            out = values.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return out.reshape(input.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    convert._pdd_patched = True  # type: ignore[attr-defined]
    interpreter._convert_float = convert
