"""TestSwitches: the test-only fault injections and negative controls; all off in production.

Two environment variables (named in `config`) switch them on, read once per process by `from_env`:
`SGLANG_PDD_TEST_KNOBS` names a JSON file of `TestKnobs`, which `knobs()` re-reads at each use so that a
test can change them while the server runs (tests/e2e/cluster.py, `PDDServers.set_knobs`), and
`SGLANG_PDD_TESTING=1`, without which `drop_eager_kv` is ignored. Only the control modules
(decode/relay/controls.py, decode/main/controls.py, transfer/controls.py) import this one: they read
the process's instance (`for_process`) once, when their role starts, and give the serving code its
controlled classes or seams; docs/testing.md lists the knobs.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields

from sglang_pdd.config import ENV_TEST_KNOBS, ENV_TESTING, PddConfigError


@dataclass(frozen=True)
class TestKnobs:
    """The knobs of a `SGLANG_PDD_TEST_KNOBS` file (each role reads its own)."""

    __test__ = False  # not a pytest test class

    main_write_delay: float = 0.0  # prefill: sleep before each KV write to MainDecode (a slow WAN write)
    main_extra_skip_pages: int = 0  # prefill: skip this many more pages for MainDecode (negative controls)
    handoff_kernel_cpu: bool = False  # main: run the handoff attention hook on CPU too (torch reference)
    packed_skip_unpack: bool = False  # main: leave packed WAN blocks in the landing region (negative control)
    # relay: answer no Ready before a request has this many output tokens (k >= it; k == it when MD's
    # Ready came first). Read when the relay admits a request. Forces a handoff with eager tokens
    # without holding anything back by time.
    relay_min_eager: int = 0
    # prefill (--pdd-relay local): relay nothing on P, as a P short of KV does: each relayed request is parked at
    # once and hands MD its first token (k = 1)
    local_relay_park: bool = False
    # main: start no handoff EXTEND before this many final handoffs are ready (a test of batched
    # handoffs waits on this state instead of on timing; 0: off)
    main_gather_handoffs: int = 0
    # main (with SGLANG_PDD_TESTING=1): every handoff discards its eager tokens' KV (negative control)
    drop_eager_kv: bool = False
    # main: zero the KV of the decode radix-cache prefix a request reuses, once its transfer is done
    # (negative control of the DRC comparison; corrupts the cache: use on servers about to stop)
    corrupt_cached_prefix: bool = False
    # main (with SGLANG_PDD_TESTING=1): the handoff EXTEND's grammar does not advance over the eager
    # tokens (negative control of constrained decoding across the handoff)
    main_skip_grammar_advance: bool = False


@dataclass(frozen=True)
class TestSwitches:
    __test__ = False

    knobs_file: str | None = None  # SGLANG_PDD_TEST_KNOBS
    testing: bool = False  # SGLANG_PDD_TESTING=1

    @classmethod
    def from_env(cls, environ: dict | None = None) -> TestSwitches:
        env = environ if environ is not None else os.environ
        return cls(knobs_file=env.get(ENV_TEST_KNOBS) or None, testing=env.get(ENV_TESTING) == "1")

    @property
    def on(self) -> bool:
        """A knobs file is named (else `knobs()` is all defaults and reads nothing)."""
        return self.knobs_file is not None

    @property
    def controlled(self) -> bool:
        """Any switch is on: the control modules build their controlled classes and seams."""
        return self.on or self.testing

    def knobs(self) -> TestKnobs:
        """The knobs now (defaults without a file, or while the file is missing)."""
        if self.knobs_file is None:
            return TestKnobs()
        return read_knobs(self.knobs_file)

    def drop_eager_kv(self) -> bool:
        return self.testing and self.on and self.knobs().drop_eager_kv


OFF = TestSwitches()


@functools.lru_cache(maxsize=1)
def for_process() -> TestSwitches:
    """This process's switches, read from its environment on first use."""
    return TestSwitches.from_env()


def read_knobs(path: str) -> TestKnobs:
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        return TestKnobs()
    except ValueError as e:
        raise PddConfigError(f"{ENV_TEST_KNOBS} file {path}: not JSON: {e}") from None
    types = {f.name: f.type for f in fields(TestKnobs)}
    unknown = sorted(set(d) - set(types))
    if unknown:
        raise PddConfigError(f"{ENV_TEST_KNOBS} file {path}: unknown knobs {unknown}")
    cast = {"float": float, "int": int, "bool": bool}  # the field annotations (strings here)
    return TestKnobs(**{k: cast[types[k]](v) for k, v in d.items()})
