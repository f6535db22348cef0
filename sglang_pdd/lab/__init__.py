"""The lab: experiments around the plugin, never imported by a server or the router.

`bench` (the agentic benchmark harness on the testbed), `micro` (micro-benchmarks and kernel tools),
`faults` (the fault suite), `sim` (the cluster simulator), `workload` (traces), `testbed` (two emulated
datacenters in network namespaces), `testing` (the tiny context model and server helpers the tests and
benchmarks share), `compat` (sglang on a CPU-only box) and `demo`. tests/unit/test_import_structure.py
pins the rule: nothing outside `sglang_pdd.lab` imports it.
"""
