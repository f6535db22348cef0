"""Benchmark tools: client, runner, report; the handoff microbenchmark; the kernels' benchmarks and
compile-only resource report (the workload generator is `sglang_pdd.workload`).

Importing this package is cheap: it imports no submodule, no sglang and no network library.
"""
