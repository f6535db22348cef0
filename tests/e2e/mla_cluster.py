"""The MLA test model's servers for the e2e modules (tests/e2e/test_mla_*.py): the model (DeepSeek-V3
architecture, `TinyModelSpec(arch="mla")`), the flags and environment sglang's CPU path needs to serve it
(the `intel_amx` attention backend over the compat layer's torch ops), and a single server as the
reference for token identity (greedy and seeded)."""

from __future__ import annotations

import os

import pytest

from sglang_pdd.lab.testing import tiny_mla
from sglang_pdd.lab.testing.launch_args import ServerConfig
from sglang_pdd.lab.testing.prompts import PromptMaker
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build_cached

MLA_FLAGS = ("--attention-backend", tiny_mla.ATTENTION_BACKEND)
MLA_ENV = dict(tiny_mla.SERVER_ENV)


@pytest.fixture(scope="module")
def mla_model(artifacts_dir, tiny_model) -> str:  # tiny_model: skips where sglang is not installed
    """The MLA test model's directory (a fixture: a module imports it from here)."""
    return build_cached(os.path.join(artifacts_dir, "models"), TinyModelSpec(arch="mla"))


@pytest.fixture(scope="module")
def mla_prompts(mla_model):
    return PromptMaker(mla_model)


def start_reference(server_group, model: str, port: int):
    """A single MLA server (not yet ready: `.wait_ready()`), with the roles' seeded sampler."""
    return server_group.start(f"mla-reference-{port}", ServerConfig(
        model=model, port=port, nccl_port=port + 1000, env=dict(MLA_ENV),
        extra=[*MLA_FLAGS, "--pdd-seeded-sampling", "on"]))


def start_mla_pdd(server_group, model: str, *, prefill_extra: tuple = (), main_extra: tuple = (), **kw):
    """`cluster.start_pdd` on the MLA model: every role on sglang's MLA path."""
    from .cluster import start_pdd

    return start_pdd(server_group, model, prefill_extra=(*MLA_FLAGS, *prefill_extra), relay_extra=MLA_FLAGS,
                     main_extra=(*MLA_FLAGS, *main_extra), env=MLA_ENV, **kw)
