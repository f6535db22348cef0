"""`pdd`: the PDD pipeline driven by hand (no PDD router yet), registered as a bench system.

P (`--pdd-role prefill`) and RLD (`--pdd-role relay`) in cluster A, MD (`--pdd-role main` with the
decode radix cache) in cluster B; every server gets the same `SGLANG_PDD_SECRET`. The client does
the router's job the way `sglang_pdd.testing.pdd_client.relayed_generate` does (P gets a second
request for MD's room unless `FANOUT`), except that RLD's answer is *streamed*, so TTFT is the
first token RLD streams. Every request takes P -> RLD -> MD (no routing policy: the P -> MD
shortcut for high-hit requests waits for the router). End-to-end is when MD (or RLD, if it finished
the request itself) is done; the output is RLD's t1..tk followed by MD's tokens from k.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time

from sglang_pdd.bench.client import StreamResult, stream
from sglang_pdd.bench.systems import (BOOTSTRAP_PORT, DECODE_PORT, PREFILL_PORT, Deployment, InNamespace,
                                      UpstreamPD, register)
from sglang_pdd.protocol.request import RequestParams
from sglang_pdd.testing.client import generate
from sglang_pdd.testing.launch_args import ServerConfig
from sglang_pdd.testing.servers import ServerGroup

logger = logging.getLogger(__name__)

RELAY_PORT, TOKEN_PORT = 30250, 18500


def with_params(body: dict, params: RequestParams) -> dict:
    sp = dict(body.get("sampling_params") or {})
    sp["custom_params"] = {**(sp.get("custom_params") or {}), **params.to_custom_params()}
    return {**body, "sampling_params": sp}


@register("pdd")
class PddHandDriven(UpstreamPD):
    name = "pdd"
    sim_name = "pdd-one-shot"
    description = "PDD P->RLD->MD for every request, hand-driven client (no PDD router yet)"
    FANOUT = False  # the path the handoff e2e tests pin; True = P's fan-out sender feeds MD

    def start(self, dep: Deployment) -> None:
        tb = self._tb = dep.testbed
        a_ns, b_ns = tb.ns("A"), tb.ns("B")
        self._a, b = tb.addr("A"), tb.addr("B")
        env = {"SGLANG_PDD_SECRET": secrets.token_hex(16)}
        common = dict(model=dep.model, bootstrap_port=BOOTSTRAP_PORT, env=env)
        g = self._group = ServerGroup(dep.log_dir)
        self._prefill = g.start("prefill", InNamespace(ServerConfig(
            port=PREFILL_PORT, host=self._a, nccl_port=PREFILL_PORT + 1000, mode="prefill",
            extra=["--pdd-role", "prefill"], **common), a_ns))
        self._relay = g.start("relay", InNamespace(ServerConfig(
            port=RELAY_PORT, host=self._a, nccl_port=RELAY_PORT + 1000, mode="decode",
            extra=["--pdd-role", "relay", "--pdd-token-port", str(TOKEN_PORT)], **common), a_ns))
        self._main = g.start("main", InNamespace(ServerConfig(
            port=DECODE_PORT, host=b, nccl_port=DECODE_PORT + 1000, mode="decode", decode_radix_cache=True,
            extra=["--pdd-role", "main"], **common), b_ns))
        a_ns.call(self._prefill.wait_ready)
        a_ns.call(self._relay.wait_ready)
        b_ns.call(self._main.wait_ready)
        self._router = self._relay  # `url`: where the first tokens come from
        logger.info("pdd up: P %s, RLD %s (token channel :%d), MD %s", self._prefill.url, self._relay.url,
                    TOKEN_PORT, self._main.url)

    def send(self, body: dict, timeout_s: float) -> StreamResult:
        room, room2 = random.getrandbits(63), random.getrandbits(63)
        boot = {"bootstrap_host": self._a, "bootstrap_port": BOOTSTRAP_PORT}
        to_relay = {**body, **boot, "bootstrap_room": room}
        to_main = with_params({**body, **boot, "bootstrap_room": room2},
                              RequestParams(v=1, relay_room=room, relay=f"tcp://{self._a}:{TOKEN_PORT}"))
        calls = [("main", self._main.url, to_main)]
        if self.FANOUT:
            calls.append(("prefill", self._prefill.url, with_params(to_relay, RequestParams(v=1, main_room=room2))))
        else:
            calls += [("prefill", self._prefill.url, to_relay), ("prefill_main", self._prefill.url, to_main)]
        results: dict[str, object] = {}
        t0 = time.monotonic()

        def call(name: str, url: str, b: dict) -> None:
            try:
                results[name] = generate(url, b, timeout=timeout_s)
            except Exception as e:  # reported below
                results[name] = e
            results[name + "_s"] = time.monotonic() - t0

        threads = [threading.Thread(target=call, args=c, daemon=True) for c in calls]
        for t in threads:
            t.start()
        relay = stream(self._relay.url, to_relay, timeout_s)
        relay_done = time.monotonic() - t0
        for t in threads:
            t.join(timeout_s)
        if not relay.ok:
            return relay
        main = results.get("main")
        if relay.finish_reason.get("type") == "pdd_handoff":
            k = int(relay.finish_reason["handoff_tokens"])
            if not isinstance(main, dict):
                return StreamResult(False, error=f"main: {main}")
            ids = relay.output_ids[:k] + list(main["output_ids"])[k:]
            e2e = float(results["main_s"])
        else:  # RLD finished the request itself
            ids, e2e = relay.output_ids, relay_done
        return StreamResult(True, ttft_s=relay.ttft_s, e2e_s=e2e, prompt_tokens=relay.prompt_tokens,
                            output_tokens=len(ids), cached_tokens=relay.cached_tokens, output_ids=ids)
