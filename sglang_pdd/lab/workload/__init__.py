"""The agentic workload: the request spec (`request`), its generator (`generator`), its two
distributions (`distributions`) and JSONL traces (`trace`); shared by the bench and the simulator.

Importing this package is cheap: it imports no submodule.
"""
