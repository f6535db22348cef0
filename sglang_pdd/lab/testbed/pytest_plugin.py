"""pytest fixtures for the two-cluster testbed.

Import the fixtures into a conftest.py (pytest only honours `pytest_plugins` in the root one):

    from sglang_pdd.lab.testbed.pytest_plugin import testbed_factory, wan_testbed  # noqa: F401

    def test_something(testbed_factory):
        tb = testbed_factory(delay_ms=10, rate_mbit=1000)     # up, unique prefix, torn down at the end
        proc = subprocess.Popen(tb.ns("B").argv([...]))

Tests skip (with the reason) where the testbed cannot run: not root, no iproute2 (`ip`, `tc`), no
iptables. Every testbed gets a prefix unique to this pytest process (`pt<pid>n<k>`) and its state
goes to a pytest temp directory, so concurrent runs do not collide; namespaces left by a pytest
process that no longer exists are deleted when the fixture starts.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import NetNS, netns_supported
from .link import tools_missing
from .testbed import Testbed

logger = logging.getLogger(__name__)

_counter = itertools.count()
STEM = "pt"


def why_no_testbed(backend: str = "nfqueue") -> str | None:
    """Why the testbed cannot run here (None when it can)."""
    ok, why = netns_supported()
    if not ok:
        return why
    missing = tools_missing(backend)
    if missing:
        return f"testbed needs {', '.join(missing)} (apt-get install iproute2 iptables)"
    return None


def unique_prefix(stem: str = STEM) -> str:
    """A namespace prefix unique to this process and call (e.g. `pt4711n3`)."""
    return f"{stem}{os.getpid()}n{next(_counter)}"


def prune_stale(stem: str = STEM) -> list[str]:
    """Delete the namespaces of fixture testbeds whose pytest process is gone (killed before its
    teardown ran); their prefix names the owner PID. Returns the names deleted."""
    pattern = re.compile(rf"^{re.escape(stem)}(\d+)n\d+[AB]$")
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    pruned = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = pattern.match(name)
        if m and int(m.group(1)) != os.getpid() and not os.path.exists(f"/proc/{m.group(1)}"):
            NetNS(name).delete()
            pruned.append(name)
    if pruned:
        logger.info("pruned stale testbed namespaces: %s", " ".join(pruned))
    return pruned


TestbedFactory = Callable[..., Testbed]


@pytest.fixture(scope="session")
def testbed_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestbedFactory]:
    """`make(**Testbed kwargs) -> Testbed` (already up); every testbed made is downed at session end.

    Tests may call `tb.down()` themselves earlier; it is idempotent."""
    reason = why_no_testbed()
    if reason:
        pytest.skip(reason)
    prune_stale()
    run_dir: Path = tmp_path_factory.mktemp("testbed")
    made: list[Testbed] = []

    def make(**kwargs: Any) -> Testbed:
        kwargs.setdefault("prefix", unique_prefix())
        kwargs.setdefault("run_dir", run_dir)
        tb = Testbed(**kwargs)
        made.append(tb)
        return tb.up()

    yield make
    for tb in reversed(made):
        tb.down()


@pytest.fixture(scope="session")
def wan_testbed(testbed_factory: TestbedFactory) -> Testbed:
    """One shared testbed for the session: 20 ms one way, 100 Mbit/s, no jitter, no loss."""
    return testbed_factory(delay_ms=20.0, rate_mbit=100.0)
