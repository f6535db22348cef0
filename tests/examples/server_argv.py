"""A launch_server command line of an example, parsed as sglang and the plugin parse it."""

from __future__ import annotations

import argparse
import contextlib
import os

import pytest

from sglang_pdd import config


@contextlib.contextmanager
def role_environment(env: dict):
    """os.environ as the example's server has it, as far as the plugin reads it: its SGLANG_PDD_* variables
    only (the suite's own SGLANG_PDD_SECRET gone)."""
    saved = dict(os.environ)
    try:
        for k in [k for k in os.environ if k.startswith("SGLANG_PDD_")]:
            del os.environ[k]
        os.environ.update({k: v for k, v in env.items() if k.startswith("SGLANG_PDD_")})
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_server(server_parser, role: str, argv: list[str], env: dict | None = None):
    """(sglang's namespace, the plugin's config) of `python -m sglang.launch_server ...` for `role`: a
    `--config FILE` merged as sglang merges it; the keys checked in `env` (the server's environment)
    where given, else in this process's."""
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    args = argv[3:]
    if "--config" in args:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        args = ConfigArgumentMerger(server_parser).merge_config_with_args(args)
    try:
        ns = server_parser.parse_args(args)
    except argparse.ArgumentError as e:
        pytest.fail(f"{role}: {e}")
    with role_environment(env) if env is not None else contextlib.nullcontext():
        cfg = config.from_cli_args(ns, ns.disaggregation_mode, ns.disaggregation_decode_enable_radix_cache)
    assert cfg.role.value == role
    return ns, cfg
