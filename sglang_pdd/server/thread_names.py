"""Name each Python thread after itself in the kernel (`/proc/<pid>/task/<tid>/comm`), so the bench's
per-thread CPU (bench/cpu.py) tells a scheduler loop from a transfer worker.

Linux gives a new thread its creator's name (sglang's `sglang::scheduler`, ...) and Python never
sets another. `install()` (the plugin calls it when `SGLANG_PDD_THREAD_NAMES=1`, which the benchmark
sets for every server) makes each `threading.Thread` set its own name on start: its target's
function name for a default-named thread ("Thread-3 (transfer_worker)" -> "transfer_worker"), else
its name; 15 bytes, the kernel's limit. Threads started by C++ (Mooncake's) keep the inherited name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import threading

ENV = "SGLANG_PDD_THREAD_NAMES"
_PR_SET_NAME = 15
_DEFAULT = re.compile(r"^Thread-\d+(?: \((?P<target>.+)\))?$")
_installed = False


def kernel_name(thread_name: str) -> str:
    m = _DEFAULT.match(thread_name)
    name = (m.group("target") or thread_name) if m else thread_name
    return name.encode("utf-8", "replace")[:15].decode("utf-8", "ignore") or "thread"


def install(environ: dict | None = None) -> bool:
    global _installed
    if _installed or (environ if environ is not None else os.environ).get(ENV) != "1":
        return _installed
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return False
    original = threading.Thread._bootstrap_inner

    def _bootstrap_inner(self):
        try:
            libc.prctl(_PR_SET_NAME, kernel_name(self.name).encode(), 0, 0, 0)
        except Exception:
            pass
        return original(self)

    threading.Thread._bootstrap_inner = _bootstrap_inner
    _installed = True
    return True
