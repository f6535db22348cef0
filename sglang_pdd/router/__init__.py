"""Router: admission, dispatch, stream stitching, OpenAI API (the policies it runs are in `sglang_pdd.policy`).

Importing this package is cheap: it imports no submodule, no sglang and no network library.
"""
