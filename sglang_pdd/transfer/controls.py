"""TransferControls: the KV transfer path's test seams, chosen once per process; all off in production.

The transfer code takes each seam as a value given when the process builds its objects: P's fan-out
builder the pages it withholds from MD (`main_extra_skip_pages`), MD's packed WAN receiver whether it
leaves the landed blocks packed (`packed_skip_unpack`), P's KV write hook what runs before each write
(`main_write_delay`: a sleep on the fan-out's main path, a slow WAN write). `for_process()` builds them
from the process's test switches (test_switches.TestKnobs); without a knobs file it is `PRODUCTION`: no
page withheld, every block unpacked, nothing before a write. The knobs are re-read at each use, so a
test can change them while the server runs (tests/e2e/cluster.py, `PDDServers.set_knobs`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

from sglang_pdd import test_switches
from sglang_pdd.test_switches import TestKnobs, TestSwitches
from sglang_pdd.transfer.lanes import MAIN_PATH


def no_extra_pages() -> int:
    return 0


def never() -> bool:
    return False


def nothing(path: str) -> None:
    pass


@dataclass(frozen=True)
class TransferControls:
    extra_skip_pages: Callable[[], int] = no_extra_pages  # P: pages withheld from MD beyond its hit
    skip_unpack: Callable[[], bool] = never  # MD: leave packed WAN blocks in the landing region
    before_kv_write: Callable[[str], None] = nothing  # P: runs before each KV write, given its path (lanes)


PRODUCTION = TransferControls()


def from_switches(switches: TestSwitches, sleep: Callable[[float], None] = time.sleep) -> TransferControls:
    """The seams under these switches: `PRODUCTION` without a knobs file, else each reads its knob."""
    if not switches.on:
        return PRODUCTION
    knobs = switches.knobs
    return TransferControls(extra_skip_pages=lambda: knobs().main_extra_skip_pages,
                            skip_unpack=lambda: knobs().packed_skip_unpack,
                            before_kv_write=functools.partial(delay_main_write, knobs, sleep))


def delay_main_write(knobs: Callable[[], TestKnobs], sleep: Callable[[float], None], path: str) -> None:
    """`main_write_delay`: a KV write on the fan-out's main path (to MD) sleeps that long first."""
    if path == MAIN_PATH:
        sleep(knobs().main_write_delay)


@functools.lru_cache(maxsize=1)
def for_process() -> TransferControls:
    """This process's seams, from its test switches, on first use."""
    return from_switches(test_switches.for_process())
