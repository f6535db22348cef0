"""A launch_server command line of an example, parsed as sglang and the plugin parse it."""

from __future__ import annotations

import argparse

import pytest

from sglang_pdd import config


def parse_server(server_parser, role: str, argv: list[str]):
    """(sglang's namespace, the plugin's config) of `python -m sglang.launch_server ...` for `role`."""
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    try:
        ns = server_parser.parse_args(argv[3:])
    except argparse.ArgumentError as e:
        pytest.fail(f"{role}: {e}")
    cfg = config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)
    assert cfg.role.value == role
    return ns, cfg
