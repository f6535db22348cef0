"""The plugin's choice at load for each capability of patches/ (plugin.CAPABILITIES).

`plugin.load()` records it: True where sglang's extension point serves the capability (patched
sglang), False where its hooks do. A PDD server reports it in `/get_server_info`
(`internal_states[i]["pdd_capabilities"]`, hooks/server_info.py), so a test can tell which path
each server took.
"""

from __future__ import annotations

KEY = "pdd_capabilities"
CHOSEN: dict[str, bool] = {}


def record(paths: dict[str, bool]) -> None:
    CHOSEN.clear()
    CHOSEN.update(paths)
