"""Two-cluster WAN testbed: namespaces "A" and "B" joined by a link with delay, jitter, rate, loss.

See docs/testbed.md. `Testbed` builds it; `python -m sglang_pdd.lab.testbed up|down|probe` drives it
from a shell; `sglang_pdd.lab.testbed.pytest_plugin` gives tests a fixture.

Names are imported lazily, so `python -m sglang_pdd.lab.testbed.<module>` (the delay daemon, the probe
server) does not import its own module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import LinkConfig
    from .testbed import SIDES, Testbed, TestbedError

__all__ = ["SIDES", "LinkConfig", "Testbed", "TestbedError"]


def __getattr__(name: str) -> Any:
    if name == "LinkConfig":
        from .config import LinkConfig

        return LinkConfig
    if name in ("SIDES", "Testbed", "TestbedError"):
        from . import testbed

        return getattr(testbed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
