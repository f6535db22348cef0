"""The fixture's skip reasons and prefixes (no root needed)."""

from __future__ import annotations

import shutil

from sglang_pdd.lab.testbed import pytest_plugin
from sglang_pdd.lab.testbed.state import check_prefix


def test_not_root_is_a_skip_reason(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert "root" in (pytest_plugin.why_no_testbed() or "")


def test_missing_iptables_is_a_skip_reason(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "iptables" else real(name) or f"/x/{name}")
    assert "iptables" in (pytest_plugin.why_no_testbed() or "")


def test_prefixes_are_unique_and_valid():
    a, b = pytest_plugin.unique_prefix(), pytest_plugin.unique_prefix()
    assert a != b and check_prefix(a) == a and check_prefix(b) == b
