"""Micro-benchmarks and kernel tools: one mechanism at a time, apart from the agentic harness (`lab.bench`).

The handoff (`handoff_micro`, `handoff_peers`, `handoff_recompute`), the kernels on a GPU
(`handoff_kernel` against `handoff_comparators`, `pack_kernel`, `fp8_effect`; `device_check` runs them with the kernel tests, each point
bounded by `bounded`, against `roofline`) and without one (`compile_only`, `resource_report`), the packed
WAN path (`wan_pack`, `mooncake_tcp`), idle waiting (`idle_micro`), the plugin's decode overhead
(`decode_overhead`) and the router at load (`router_bench`).
"""
