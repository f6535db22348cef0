"""The MLA test model's servers for the e2e modules (tests/e2e/test_mla_*.py): the flags and environment
sglang's CPU path needs to serve it (the `intel_amx` attention backend over the compat layer's torch ops),
a single server as the reference for token identity (greedy and seeded; the session's `mla_reference`
fixture, tests/conftest.py, with the model and prompts), and a PDD cluster on it."""

from __future__ import annotations

from sglang_pdd.lab.testing import tiny_mla
from sglang_pdd.lab.testing.launch_args import ServerConfig

MLA_FLAGS = ("--attention-backend", tiny_mla.ATTENTION_BACKEND)
MLA_ENV = dict(tiny_mla.SERVER_ENV)


CHUNK = 256  # a longer prompt's later chunks attend over cached latent rows: sglang's absorbed MLA path


def start_reference(server_group, model: str, port: int):
    """A single MLA server (not yet ready: `.wait_ready()`), with the roles' seeded sampler and chunked
    prefill of `CHUNK`."""
    return server_group.start(f"mla-reference-{port}", ServerConfig(
        model=model, port=port, nccl_port=port + 1000, env=dict(MLA_ENV), chunked_prefill_size=CHUNK,
        extra=[*MLA_FLAGS, "--pdd-seeded-sampling", "on"]))


def start_mla_pdd(server_group, model: str, *, prefill_extra: tuple = (), main_extra: tuple = (), **kw):
    """`cluster.start_pdd` on the MLA model: every role on sglang's MLA path."""
    from .cluster import start_pdd

    return start_pdd(server_group, model, prefill_extra=(*MLA_FLAGS, *prefill_extra), relay_extra=MLA_FLAGS,
                     main_extra=(*MLA_FLAGS, *main_extra), env=MLA_ENV, **kw)
