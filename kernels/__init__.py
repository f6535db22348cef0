"""Triton kernels of sglang-pdd, imported as `sglang_pdd.kernels`."""
