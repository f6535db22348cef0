"""Router: pipeline policy, bandwidth estimator, handoff-mode choice, stream stitching, OpenAI API.

Importing this package is cheap: it imports no submodule, no sglang and no network library.
The policy modules (`policy`, `bandwidth`, `handoff_mode`) are plain Python so the cluster
simulator (`sglang_pdd.sim`) runs the very objects the real router uses.
"""
