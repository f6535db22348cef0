"""The suite's one deployment on the WAN testbed: P and RLD in cluster A, two MDs in cluster B, the
PDD router in A (`--pipeline relay --migration-limit 1 --health-check-s 1`; `pipeline` and `mains`
change it for tests/e2e/test_wan_cut.py), and a single plain
server in A, the token reference. A killed server is started again with its own command line
(`restart`); `healthy` waits on every server's `/health`; `leaks` says what is not back to idle.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field

from sglang_pdd.lab.bench.systems import InNamespace
from sglang_pdd.config import ENV_TEST_KNOBS
from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.router.peers.load_feed import load_of
from sglang_pdd.lab.testing.launch_args import PddRouterConfig, ServerConfig
from sglang_pdd.lab.testing.servers import ServerGroup, ServerProcess, http_json

logger = logging.getLogger(__name__)

PREFILL, RELAY, MAIN, ROUTER, REFERENCE = 30100, 30250, 30200, 30300, 30000
BOOTSTRAP, TOKEN = 8998, 18500
ROLE_OF = {"prefill": "prefill", "relay": "relay", "main-0": "main", "main-1": "main"}


@dataclass
class Timeouts:
    """The deployment's deadlines (s): MD's handoff and KV waits, the router's idle and request limits."""

    handoff: float = 5.0
    kv: float = 60.0
    prefill_idle: float = 120.0
    relay_idle: float = 120.0  # RLD's first chunk comes after P's prefill (10000 tokens on CPU: tens of s)
    main_idle: float = 40.0  # above the handoff timeout: MD's first chunk comes after the handoff
    request: float = 240.0


@dataclass
class FaultDeployment:
    tb: object  # sglang_pdd.lab.testbed.Testbed
    model: str
    log_dir: str
    timeouts: Timeouts = field(default_factory=Timeouts)
    mains: int = 2
    main_tokens: int = 16384  # MD's --max-total-tokens
    pipeline: str = "relay"  # the router's --pipeline (auto: its pipeline policy decides, seeing peer health)
    servers: dict[str, ServerProcess] = field(default_factory=dict)  # name -> the live process
    idle_rows: dict[str, float] = field(default_factory=dict)  # name -> request rows free when idle (all)

    def __post_init__(self):
        self.group = ServerGroup(self.log_dir, grace_s=0)  # its teardown is not observed
        self._configs: dict[str, tuple[object, str]] = {}  # name -> (launchable, side)
        self.knob_files = {r: os.path.join(self.log_dir, f"{r}-knobs.json") for r in ("prefill", "relay", "main")}

    # -- start, stop, restart ---------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        for f in self.knob_files.values():
            with open(f, "w") as fh:
                fh.write("{}")
        a, b, t = self.tb.addr("A"), self.tb.addr("B"), self.timeouts
        env = {"SGLANG_PDD_SECRET": secrets.token_hex(16)}
        common = dict(model=self.model, bootstrap_port=BOOTSTRAP)
        timeout = ["--pdd-handoff-timeout", f"{t.handoff:g}"]
        # the relay binds on cluster A's testbed address, so it must be told to keep its token channel in clear
        # (the WAN is a veth pair inside this box; a deployment encrypts it: --pdd-token-curve)
        clear = ["--pdd-token-curve", "off"]
        self._add("reference", ServerConfig(port=REFERENCE, host=a, nccl_port=REFERENCE + 1000, model=self.model,
                                            extra=["--pdd-seeded-sampling", "on"]), "A")
        self._add("prefill", ServerConfig(port=PREFILL, host=a, nccl_port=PREFILL + 1000, mode="prefill", **common,
                                          extra=["--pdd-role", "prefill"],
                                          env={**env, ENV_TEST_KNOBS: self.knob_files["prefill"]}), "A")
        self._add("relay", ServerConfig(port=RELAY, host=a, nccl_port=RELAY + 1000, mode="decode", **common,
                                        extra=["--pdd-role", "relay", "--pdd-token-port", str(TOKEN), *timeout, *clear],
                                        env={**env, ENV_TEST_KNOBS: self.knob_files["relay"]}), "A")
        for i in range(self.mains):
            port = MAIN + 10 * i
            self._add(f"main-{i}", ServerConfig(
                port=port, host=b, nccl_port=port + 1000, mode="decode", decode_radix_cache=True, **common,
                max_total_tokens=self.main_tokens,
                extra=["--pdd-role", "main", "--pdd-relays", f"tcp://{a}:{TOKEN}", *timeout,
                       "--pdd-kv-timeout", f"{t.kv:g}"],
                env={**env, ENV_TEST_KNOBS: self.knob_files["main"]}), "B")
        self.healthy(240.0)
        self._add("router", PddRouterConfig(
            prefill=[(self.servers["prefill"].url, BOOTSTRAP)], relay=[(self.servers["relay"].url, TOKEN)],
            main=[self.servers[f"main-{i}"].url for i in range(self.mains)], tokenizer=self.model, port=ROUTER,
            host=a, pipeline=self.pipeline,
            extra=["--migration-limit", "1", "--health-check-s", "1", "--load-poll-s", "0.5",
                   "--request-timeout", f"{t.request:g}", "--prefill-idle-timeout", f"{t.prefill_idle:g}",
                   "--relay-idle-timeout", f"{t.relay_idle:g}", "--main-idle-timeout", f"{t.main_idle:g}"],
            env=env, openai_frontend="builtin"), "A")  # the router signs P's and MD's PDD parameters with the
        # servers' secret; builtin frontend: the suite's traffic is /generate (traffic.request)
        self.healthy(120.0)

    def _add(self, name: str, cfg, side: str) -> None:
        self._configs[name] = (cfg, side)
        self.servers[name] = self.group.start(name, InNamespace(cfg, self.tb.ns(side)))

    def restart(self, name: str) -> None:
        """Start a server that is not running again (same command line); waits on its /health."""
        s = self.servers[name]
        if s.alive():
            return
        cfg, side = self._configs[name]
        logger.info("restarting %s", name)
        self.idle_rows.pop(name, None)
        self.servers[name] = self.group.start(name, InNamespace(cfg, self.tb.ns(side)))
        self.call(name, self.servers[name].wait_ready, 240.0)

    def stop(self) -> None:
        """Every server at once, killed (a planned restart is `ServerProcess.stop`'s SIGTERM instead)."""
        self.group.stop()

    def side(self, name: str) -> str:
        return self._configs[name][1]

    def call(self, name: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` from inside the namespace of server `name` (B's servers need no WAN to be asked)."""
        return self.tb.ns(self.side(name)).call(fn, *args, **kwargs)

    # -- state ------------------------------------------------------------------------------------
    def healthy(self, timeout_s: float, router: bool = True) -> None:
        """Wait until every live server answers /health (the router's is 200 once every role has a
        peer in service; `router=False`: not waited on) and record the idle request rows of new ones."""
        for name, s in self.servers.items():
            if s.alive() and (router or name != "router"):
                self.call(name, s.wait_ready, timeout_s)
        for name, s in self.servers.items():
            if ROLE_OF.get(name) in ("relay", "main") and s.alive() and name not in self.idle_rows:
                self.idle_rows[name] = self._idle_rows(name, timeout_s)

    def _idle_rows(self, name: str, timeout_s: float) -> float:
        """Rows free when idle: all of them (`total`). Not the first `free` published: sglang's /health
        runs a one-token request that holds a row for a moment, and a baseline read then is one short."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.states(name, "sglang_pdd_req_rows").get("total")
            if got is not None or time.monotonic() > deadline:
                if got is None:
                    raise RuntimeError(f"{name} never published sglang_pdd_req_rows")
                return got
            time.sleep(0.5)

    def metrics_text(self, name: str) -> str:
        status, text = self.call(name, http_json, self.servers[name].url + "/metrics", None, 10.0)
        if status != 200 or not isinstance(text, str):
            raise RuntimeError(f"{name}: /metrics answered {status}")
        return text

    def states(self, name: str, metric: str) -> dict:
        return {dict(k).get("state"): v for k, v in parse_exposition(self.metrics_text(name), metric).items()}

    def metric(self, name: str, metric: str) -> dict:
        return parse_exposition(self.metrics_text(name), metric)

    def migrations(self) -> dict[str, float]:
        """The router's sglang_pdd_router_migrations_total as {"cause/outcome": n}."""
        return {f"{dict(k)['cause']}/{dict(k)['outcome']}": v
                for k, v in self.metric("router", "sglang_pdd_router_migrations_total").items()}

    def leaks_now(self) -> list[str]:
        """What is not idle on each live server now: request rows, handoff table entries, requests
        running or queued (sglang's gauges), the router's in-flight counts."""
        out = []
        for name, s in self.servers.items():
            if not s.alive() or name == "reference":
                continue
            try:
                text = self.metrics_text(name)
            except (OSError, RuntimeError) as e:
                out.append(f"{name}: /metrics unreadable ({e})")
                continue
            if name == "router":
                busy = {dict(k).get("peer", "?"): v for k, v in
                        parse_exposition(text, "sglang_pdd_router_peer_in_flight").items() if v}
                if busy:
                    out.append(f"router: in flight {busy}")
                continue
            load = load_of(text)
            if load is not None and load[0]:
                out.append(f"{name}: {load[0]:g} requests running or queued")
            if name in self.idle_rows:
                free = {dict(k).get("state"): v for k, v in parse_exposition(text, "sglang_pdd_req_rows").items()}.get("free")
                if free != self.idle_rows[name]:
                    out.append(f"{name}: {free} request rows free, {self.idle_rows[name]} when idle")
            if ROLE_OF.get(name) == "main":
                held = sum(parse_exposition(text, "sglang_pdd_handoff_held_requests").values())
                if held:
                    out.append(f"{name}: {held:g} handoff entries held")
        return out

    def leaks(self, timeout_s: float = 60.0) -> list[str]:
        """`leaks_now` once it is empty, or what is left after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.leaks_now()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def set_knobs(self, role: str, **knobs) -> None:
        path = self.knob_files[role]
        with open(path + ".tmp", "w") as f:
            json.dump(knobs, f)
        os.replace(path + ".tmp", path)
