"""A test-harness switch: sglang's scheduler and detokenizer processes forked from the launcher instead of
spawned, so that they do not import sglang, torch and transformers again.

sglang forces the ``spawn`` start method (in its engine module's ``_set_envs_and_config``): on a GPU a forked child cannot
use CUDA once its parent has. On a CPU-only box nothing stops a fork, and the import is most of what a
server start costs: on the tiny test model one start took 42 s of CPU spawned and 19 s forked (ready after
30 s and 19 s; same greedy output). The e2e suite starts some 75 servers on a 2-core box.

Only ``SGLANG_PDD_CPU_FORK_CHILDREN=1`` turns it on (tests/conftest.py sets it for the test servers; one
shared PDD cluster sets it back to ``0`` and a test asserts its roles' children were spawned, so the path
users run stays proven). At the moment sglang starts its children the launcher runs one Python thread
(checked: the scheduler and detokenizer start before the tokenizer manager, the HTTP server or any
bootstrap thread), which is what makes a fork safe; if another thread is alive then, the switch logs it
and keeps ``spawn``. Never installed outside a CPU environment (it lives in the CPU compat ``.pth``).

What a spawned child gets from importing afresh, a forked one is given here: prometheus_client picks its
value class when it is imported (multiprocess files only if ``PROMETHEUS_MULTIPROC_DIR`` was set by then),
and the launcher imported it before sglang set that variable; a forked child then kept its counters in its
own memory, and the server's /metrics never saw them (caught by test_decode_radix_cache's byte counts).
So each forked child picks the class again before it builds a metric.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading

logger = logging.getLogger(__name__)

ENV = "SGLANG_PDD_CPU_FORK_CHILDREN"
_threads = threading.enumerate  # the threads alive now (a test gives its own)


def asked() -> bool:
    return os.environ.get(ENV, "") == "1"


def start_method() -> str:
    """The start method to use now: ``fork`` when asked and this process runs one thread, else ``spawn``."""
    if not asked():
        return "spawn"
    others = [t.name for t in _threads() if t is not threading.main_thread()]
    if others:
        logger.warning("%s=1 but threads %s are alive: keeping spawn", ENV, others)
        return "spawn"
    return "fork"


def _child_picks_metric_values() -> None:
    """In a forked child: prometheus_client's value class as a fresh import would pick it now."""
    import sys

    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        values.ValueClass = values.get_value_class()


def patch_engine(module) -> None:
    """After sglang's engine module ran: its ``_set_envs_and_config`` (which forces spawn) then picks the
    start method above. A no-op unless asked, so an environment without the variable runs stock sglang."""
    if not asked() or getattr(module, "_sglang_pdd_fork_children", False):
        return
    original = module._set_envs_and_config

    def set_envs_and_config(server_args, *args, **kwargs):
        out = original(server_args, *args, **kwargs)
        method = start_method()
        if method != "spawn":
            mp.set_start_method(method, force=True)
        return out

    module._set_envs_and_config = set_envs_and_config
    module._sglang_pdd_fork_children = True
    os.register_at_fork(after_in_child=_child_picks_metric_values)
