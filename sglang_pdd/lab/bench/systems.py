"""The compared deployments: one `System` interface, registered by name.

A system starts its servers on a `Testbed` (every server inside cluster A's or B's namespace, with
`--host` and `SGLANG_HOST_IP` its own namespace address), answers streamed requests sent from
cluster A, reports the KV bytes its prefill moved, and stops. The baselines are upstream sglang PD
behind the upstream router (`sglang_router --pd-disaggregation --mini-lb`) in cluster A:

* `same-dc`: prefill and decode both in cluster A (the lower bound);
* `cross-dc`: decode in cluster B, no decode radix cache (every turn ships its whole prompt's KV);
* `cross-dc-drc`: decode in cluster B with `--disaggregation-decode-enable-radix-cache`.

New systems join with `@register("name")` on a `System` subclass, in a module listed in
`EXTRA_SYSTEM_MODULES`: `pdd` and `pdd-relay` (bench/pdd_system.py) are the PDD pipeline.
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from sglang_pdd.lab.bench import placement as place
from sglang_pdd.lab.bench.client import StreamResult, stream
from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.lab.testbed.netns import NetNS
from sglang_pdd.lab.testing.launch_args import RouterConfig, ServerConfig
from sglang_pdd.lab.testing.servers import Launchable, ServerGroup, ServerProcess, http_json

logger = logging.getLogger(__name__)

PREFILL_PORT, DECODE_PORT, ROUTER_PORT, BOOTSTRAP_PORT = 30100, 30200, 30300, 8998
KV_METRIC = "sglang_pdd_transfer_bytes_total"
SLICES_METRIC = "sglang_pdd_transfer_slices_total"


@dataclass
class Deployment:
    """What a system needs to start: the testbed, the model directory, where logs go."""

    testbed: object  # sglang_pdd.lab.testbed.Testbed (duck-typed: ns(side), addr(side))
    model: str
    log_dir: str
    kv_bytes_per_token: int | None = None
    # added to every sglang server of every system (baselines too): the idle behaviour under test
    server_flags: tuple[str, ...] = ()
    cpus: dict = field(default_factory=dict)  # side -> CPU list for `taskset -c` (bench.placement)
    threads: dict = field(default_factory=dict)  # sglang mode (prefill/decode/null) -> torch threads (0: default)
    ttft_slo_s: float = 0.0  # the preset's TTFT SLA (the PDD router's --ttft-slo-secs; 0: not told)

    def server(self, cfg: ServerConfig, side: str) -> "InNamespace":
        """`cfg` (plus `server_flags`) run in `side`'s namespace, on its CPU set if one is given, with
        the torch (OpenMP) thread count of its mode if one is given."""
        cfg.extra = list(cfg.extra) + list(self.server_flags)
        if self.threads.get(cfg.mode):
            cfg.env = {**cfg.env, **place.thread_env(self.threads[cfg.mode])}
        return self.process(cfg, side)

    def process(self, inner: Launchable, side: str) -> "InNamespace":
        return InNamespace(inner, self.testbed.ns(side), self.cpus.get(side))


@dataclass
class InNamespace:
    """A server command line run inside a namespace (`ip netns exec`)."""

    inner: Launchable
    ns: NetNS
    cpus: str | None = None  # `taskset -c` list; None: wherever the kernel puts it

    @property
    def url(self) -> str:
        return self.inner.url

    def argv(self) -> list[str]:
        inner = self.inner.argv()
        return self.ns.argv(["taskset", "-c", self.cpus, *inner] if self.cpus else inner)

    def environ(self) -> dict[str, str]:
        return self.inner.environ()


def kv_bytes_sent(metrics_text: str) -> int:
    """KV bytes P's transfer engine moved, summed over peers, from a /metrics exposition."""
    samples = parse_exposition(metrics_text, KV_METRIC)
    return int(sum(v for labels, v in samples.items() if dict(labels).get("kind") == "kv"))


def kv_slices_sent(metrics_text: str) -> int:
    """Slices of P's completed KV writes (one source/destination range each): page by page one per
    contiguous page run, layer and K/V; packed one per block plus its table entry."""
    samples = parse_exposition(metrics_text, SLICES_METRIC)
    return int(sum(v for labels, v in samples.items() if dict(labels).get("kind") == "kv"))


class System(ABC):
    """One deployment under test. `client_side` is the cluster the client runs in."""

    name: ClassVar[str] = ""
    sim_name: ClassVar[str] = ""  # the simulator's name for it (sim.systems.SYSTEM_NAMES)
    description: ClassVar[str] = ""
    client_side: ClassVar[str] = "A"

    @abstractmethod
    def start(self, dep: Deployment) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @property
    @abstractmethod
    def url(self) -> str:
        """Where the client sends `/generate` (an address in `client_side`)."""

    def send(self, body: dict, timeout_s: float) -> StreamResult:
        """One streamed request (called from a thread inside `client_side`)."""
        return stream(self.url, body, timeout_s)

    def send_warmup(self, body: dict, timeout_s: float) -> StreamResult:
        """A warm-up: a session's context from before the window (see sglang_pdd.lab.workload.generator)."""
        return self.send(body, timeout_s)

    def kv_bytes_sent(self) -> int | None:
        """Cumulative KV bytes the prefill side moved (called inside `client_side`); None if unknown."""
        return None

    def kv_slices_sent(self) -> int | None:
        """Cumulative slices of those KV writes (called inside `client_side`); None if unknown."""
        return None

    def servers(self) -> list[ServerProcess]:
        return []


_REGISTRY: dict[str, Callable[[], System]] = {}
# Modules that register more systems, imported on first use of the registry (no import cycle).
EXTRA_SYSTEM_MODULES = ("sglang_pdd.lab.bench.pdd_system",)
_loaded = False


def _load_extra() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in EXTRA_SYSTEM_MODULES:
            importlib.import_module(mod)


def register(name: str) -> Callable[[Callable[[], System]], Callable[[], System]]:
    def deco(factory: Callable[[], System]) -> Callable[[], System]:
        if name in _REGISTRY:
            raise ValueError(f"system {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory
    return deco


def system_names() -> list[str]:
    _load_extra()
    return list(_REGISTRY)


def make_system(name: str) -> System:
    _load_extra()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(_REGISTRY)}") from None


def parse_systems(spec: str) -> list[str]:
    """'a,b,c' -> names, each checked against the registry, order kept, duplicates refused."""
    _load_extra()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("no systems given")
    if len(set(names)) != len(names):
        raise ValueError(f"a system is listed twice: {spec!r}")
    for n in names:
        if n not in _REGISTRY:
            raise ValueError(f"unknown system {n!r}; known: {', '.join(_REGISTRY)}")
    return names


class UpstreamPD(System):
    """Upstream sglang PD: prefill and the router in A, decode in `decode_side`."""

    decode_side: ClassVar[str] = "A"
    decode_radix_cache: ClassVar[bool] = False

    def __init__(self) -> None:
        self._group: ServerGroup | None = None
        self._prefill: ServerProcess | None = None
        self._router: ServerProcess | None = None
        self._tb = None

    def start(self, dep: Deployment) -> None:
        tb = self._tb = dep.testbed
        a_ns, d_ns = tb.ns("A"), tb.ns(self.decode_side)
        a_host, d_host = tb.addr("A"), tb.addr(self.decode_side)
        g = self._group = ServerGroup(dep.log_dir, grace_s=0)  # killed between systems
        p = self._prefill = g.start("prefill", dep.server(ServerConfig(
            model=dep.model, port=PREFILL_PORT, host=a_host, nccl_port=PREFILL_PORT + 1000, mode="prefill",
            bootstrap_port=BOOTSTRAP_PORT), "A"))
        d = g.start("decode", dep.server(ServerConfig(
            model=dep.model, port=DECODE_PORT, host=d_host, nccl_port=DECODE_PORT + 1000, mode="decode",
            bootstrap_port=BOOTSTRAP_PORT, decode_radix_cache=self.decode_radix_cache), self.decode_side))
        a_ns.call(p.wait_ready)
        d_ns.call(d.wait_ready)
        self._router = g.start("router", dep.process(RouterConfig(
            prefill=[(p.url, BOOTSTRAP_PORT)], decode=[d.url], port=ROUTER_PORT, host=a_host), "A"))
        a_ns.call(self._router.wait_ready)
        logger.info("%s up: prefill %s, decode %s (%s), router %s", self.name, p.url, d.url,
                    self.decode_side, self._router.url)

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()
            self._group = None

    @property
    def url(self) -> str:
        if self._router is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._router.url

    def kv_bytes_sent(self) -> int | None:
        text = self._prefill_metrics()
        return kv_bytes_sent(text) if text is not None else None

    def kv_slices_sent(self) -> int | None:
        text = self._prefill_metrics()
        return kv_slices_sent(text) if text is not None else None

    def _prefill_metrics(self) -> str | None:
        if self._prefill is None:
            return None
        try:
            status, text = http_json(self._prefill.url + "/metrics", timeout=10)
        except OSError as e:
            logger.warning("%s: /metrics unreadable: %s", self.name, e)
            return None
        return text if status == 200 and isinstance(text, str) else None

    def servers(self) -> list[ServerProcess]:
        return list(self._group.servers) if self._group else []


@register("same-dc")
class SameDC(UpstreamPD):
    name = "same-dc"
    sim_name = "same-dc-pd"
    description = "upstream PD, prefill and decode in cluster A (lower bound)"
    decode_side = "A"


@register("cross-dc")
class CrossDC(UpstreamPD):
    name = "cross-dc"
    sim_name = "xdc-pd-naive"
    description = "upstream PD, decode in cluster B, no decode radix cache"
    decode_side = "B"


@register("cross-dc-drc")
class CrossDCDrc(UpstreamPD):
    name = "cross-dc-drc"
    sim_name = "xdc-pd-drc"
    description = "upstream PD, decode in cluster B with the decode radix cache"
    decode_side = "B"
    decode_radix_cache = True
