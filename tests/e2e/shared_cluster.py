"""Clusters that consecutive e2e modules share. A PDD cluster takes 45-80 s to start on the 2-core CI box
and many modules' tests take seconds, so modules that need the same servers take one start between them.

A module (or a class) names its cluster with `pytest.mark.shared_cluster(KEY)`; the collection moves the
modules of one key next to the first of them (`group_by_cluster`, called from tests/conftest.py); the
first to ask (`SharedClusters.get`) starts the cluster, the next module gets the same one with its test
knobs cleared (and a fresh one if any of its servers died); `close_after` stops it once the next test
names another key. At most one shared cluster lives at a time, beside the modules' own servers (their
routers and references, in `server_group`). Every key's servers are defined here, so what its modules
share is visible in one place; a module's own flags would be another key.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Callable

import pytest

from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.lab.testing.servers import ServerGroup

MARK = "shared_cluster"
KEYED = "relay-keyed"  # P, RLD, MD behind sglang's --api-key, RLD and MD streaming deltas, MD publishing its KV
#                        events: test_agent_front_door, test_health_probe, test_hostile_clients, test_pdd_router,
#                        test_two_routers (the modules that run roles without a key or streaming cumulatively
#                        start their own: test_md_pool, test_mla_pdd, test_patched_sglang)

OVERLAP = "overlap-page16"  # P (pages of 16, chunked prefill of 256), RLD and MD on sglang's overlap loop, and a
#                              single server on that loop: test_relay_handoff, test_relay_restarts
OVERLAP_PAGE, OVERLAP_CHUNK = 16, 256
OVERLAP_HANDOFF_TIMEOUT = 30  # MD waits this long for eager tokens: a slow box must not decide an outcome
MD_EVENTS, MD_EVENTS_REPLAY = 5594, 5595  # KEYED's MD publishes its KV events here (test_two_routers reads them)
ROLE_KEY = "pdd-e2e-role-key"  # KEYED's roles' --api-key; its routers send it (SGLANG_PDD_ROLE_API_KEY)
INCREMENTAL = ("--incremental-streaming-output",)
SPAWN_ENV = "SGLANG_PDD_CPU_FORK_CHILDREN"  # "0": sglang spawns the roles' children (sglang_pdd.lab.compat.fork_children)

PAIR = "p-md"  # P and MD alone, no RLD (MD: a small KV pool that evicts, KV events, a trusted relay nobody
#                serves): test_kv_events (first: it reads MD's cache from empty), test_main_robustness
PAIR_PORT, PAIR_BOOT = 31400, 9400
PAIR_EVENTS, PAIR_EVENTS_REPLAY = 5590, 5591
PAIR_POOL = 2400  # MD's --max-total-tokens: two of test_kv_events' conversations do not fit
PAIR_TRUSTED_RELAY = "tcp://127.0.0.1:18591"  # MD's --pdd-relays; nothing listens there
PAIR_P_RELAY = "tcp://127.0.0.1:18592"  # P relays too (--pdd-relay local): its token channel, on MD's --pdd-relays


def _kv_events(endpoint: int, replay: int) -> tuple[str, str]:
    """An MD's flag to publish its KV events (ZMQ) on these ports."""
    return "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{endpoint}",
                                             "replay_endpoint": f"tcp://*:{replay}"})


def _keyed(group: ServerGroup, model: str):
    from .cluster import start_pdd

    # RLD and MD stream deltas (--incremental-streaming-output); the other modules' stream cumulatively.
    # Its roles spawn their children, as users' servers do (the other test servers fork them: tests/conftest.py);
    # test_health_probe asserts it.
    return start_pdd(group, model, base_port=34800, bootstrap_port=8978, token_port=18795, handoff_timeout=10,
                     relay_extra=INCREMENTAL, main_extra=(*INCREMENTAL, *_kv_events(MD_EVENTS, MD_EVENTS_REPLAY)),
                     role_api_key=ROLE_KEY, env={SPAWN_ENV: "0"})


def _overlap(group: ServerGroup, model: str):
    """RLD and MD on sglang's overlap scheduler (its default; P cannot run it on CPU), with a single server
    on the same loop as the modules' reference (`.reference`), started alongside."""
    from sglang_pdd.lab.testing.launch_args import ServerConfig

    from .cluster import start_pdd

    reference = group.start("reference-overlap", ServerConfig(
        model=model, port=30709, nccl_port=31709, overlap=True, extra=["--pdd-seeded-sampling", "on"]))
    pdd = start_pdd(group, model, base_port=30700, bootstrap_port=8997, token_port=18500,
                    handoff_timeout=OVERLAP_HANDOFF_TIMEOUT, page_size=OVERLAP_PAGE, prefill_chunk=OVERLAP_CHUNK,
                    decode_overlap=True)
    pdd.reference = reference.wait_ready()
    return pdd


def _pair(group: ServerGroup, model: str):
    from sglang_pdd.lab.testing.launch_args import ServerConfig

    from .cluster import PD, idle_rows

    knobs = os.path.join(group.log_dir, f"pair-prefill-{PAIR_PORT}.knobs.json")
    p = group.start(f"pair-prefill-{PAIR_PORT}", ServerConfig(
        model=model, port=PAIR_PORT, nccl_port=PAIR_PORT + 1000, mode="prefill", bootstrap_port=PAIR_BOOT,
        extra=["--pdd-role", "prefill", "--pdd-relay", "local", "--pdd-token-port", PAIR_P_RELAY.rpartition(":")[2]],
        env={ENV_TEST_KNOBS: knobs}))
    md = group.start(f"pair-main-{PAIR_PORT + 1}", ServerConfig(
        model=model, port=PAIR_PORT + 1, nccl_port=PAIR_PORT + 1001, mode="decode", bootstrap_port=PAIR_BOOT,
        decode_radix_cache=True, max_total_tokens=PAIR_POOL,
        extra=["--pdd-role", "main", *_kv_events(PAIR_EVENTS, PAIR_EVENTS_REPLAY),
               "--pdd-relays", f"{PAIR_TRUSTED_RELAY},{PAIR_P_RELAY}", "--pdd-handoff-timeout", "10"]))
    p.wait_ready()
    md.wait_ready()
    return PD(prefill=p, decode=md, bootstrap_port=PAIR_BOOT, idle_rows=idle_rows(md.url), prefill_knobs=knobs)


# key -> (group, model) -> the cluster (a `cluster.PDDServers` or `cluster.PD`: `clear_knobs` unsets what a
# module set)
RECIPES: dict[str, Callable] = {KEYED: _keyed, OVERLAP: _overlap, PAIR: _pair}


class SharedClusters:
    """The one live shared cluster: its key, its servers, which module or class has it now."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.key: str | None = None
        self.cluster = None
        self.owner: str | None = None
        self.group: ServerGroup | None = None
        self.starts: Counter = Counter()  # key -> clusters started (one per key, unless a server died)

    def get(self, key: str, model: str, owner: str):
        if self.key == key and all(s.alive() for s in self.group.servers):
            if owner != self.owner:
                self.cluster.clear_knobs()
                self.owner = owner
            return self.cluster
        self.close()
        self.group = ServerGroup(self.log_dir, grace_s=0)
        self.key, self.owner = key, owner
        self.starts[key] += 1
        self.cluster = RECIPES[key](self.group, model)
        return self.cluster

    def close(self) -> None:
        if self.group is not None:
            self.group.stop()
        self.key = self.cluster = self.owner = self.group = None

    def close_after(self, nextitem) -> None:
        """After a test: stopped unless the next test uses the same cluster."""
        if self.key is not None and key_of(nextitem) != self.key:
            self.close()


def key_of(item) -> str | None:
    mark = item.get_closest_marker(MARK) if item is not None else None
    return mark.args[0] if mark else None


def cluster_for(request, shared: SharedClusters, model: str):
    """The shared cluster of the module or class behind a module- or class-scoped fixture's `request`."""
    key = key_of(request.node)
    if key is None:
        pytest.fail(f"{request.node.nodeid} asks for a shared cluster without pytest.mark.{MARK}(KEY)")
    return shared.get(key, model, owner=request.node.nodeid)


def group_by_cluster(items: list) -> None:
    """Moves every test of a key right after the first test of that key (stable otherwise): the modules
    of one cluster run one after another, so it starts once."""
    first: dict[str, int] = {}
    order = []
    for i, item in enumerate(items):
        key = key_of(item)
        if key is not None:
            first.setdefault(key, i)
        order.append(((first[key], i) if key is not None else (i, i), item))
    items[:] = [item for _, item in sorted(order, key=lambda x: x[0])]
