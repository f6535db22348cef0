"""The agentic benchmark harness: client, runner, systems, report (the workload generator is
`sglang_pdd.lab.workload`; the micro-benchmarks and kernel tools are `sglang_pdd.lab.micro`).

Importing this package is cheap: it imports no submodule, no sglang and no network library.
"""
