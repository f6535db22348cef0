"""Fixtures shared by the examples' tests."""

from __future__ import annotations

import argparse
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")


@pytest.fixture(scope="session")
def server_parser():
    """sglang 0.5.23's own launch_server parser plus the plugin's --pdd-* flags, without abbreviations
    (so `--tp` for `--tp-size` is caught) and raising instead of exiting."""
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"sglang not importable: {e}")
    from sglang_pdd import config

    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(p)
    config.add_cli_args(p)
    return p
