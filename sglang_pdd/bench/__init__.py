"""Benchmark tools: the agentic workload generator (shared with the simulator), client, report; the
handoff microbenchmark; the kernels' benchmarks and compile-only resource report.

Importing this package is cheap: it imports no submodule, no sglang and no network library.
"""
