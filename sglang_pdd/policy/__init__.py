"""Pure policy objects shared by the router, RelayDecode and the simulator: the pipeline choice
(`pipeline`), the WAN bandwidth estimate (`bandwidth`) and the one-shot/catch-up choice
(`handoff_mode`). Plain Python: no sglang, no network library; importing this package imports no
submodule.
"""
