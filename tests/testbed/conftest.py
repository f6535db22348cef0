"""Fixtures of the testbed suite: the plugin's, plus a probe server in cluster B."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_pdd.lab.testbed import Testbed
from sglang_pdd.lab.testbed.pytest_plugin import testbed_factory, wan_testbed  # noqa: F401


@pytest.fixture(scope="module")
def wan_probe_port(wan_testbed: Testbed) -> Iterator[int]:  # noqa: F811
    """Port of a probe server listening on B's address of the shared 20 ms / 100 Mbit testbed."""
    with wan_testbed.probe_server("B") as port:
        yield port
