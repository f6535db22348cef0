"""Two MainDecode servers behind the PDD router (P->MD, decode radix cache): the cache-aware router
sends a conversation's next turn to the MD that holds its history, so P ships only the new tokens'
KV; the least-loaded router (the negative control, the old default) sends it to the other, idler MD
and P ships the whole history again. Outputs are token-identical to the single server either way.

Where each turn lands is made deterministic by blockers, long streamed requests held open: one holds
an MD while turn 1 arrives, so turn 1 goes to the other (its home); the test waits until the router
sees both MDs idle (its `sglang_pdd_router_peer_load`); another holds the home MD during turn 2, so
the home MD is the busier one: the cache-aware router still picks it (the hit beats one request of
load), the least-loaded router does not.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from sglang_pdd.testing import identity
from sglang_pdd.testing.client import generate, greedy_body
from sglang_pdd.testing.launch_args import PddRouterConfig, ServerConfig

from .cluster import kv_bytes_per_token, metric

pytestmark = pytest.mark.e2e

BASE, BOOT = 31600, 9650
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def two_md(server_group, tiny_model):
    p = server_group.start("choice-prefill", ServerConfig(
        model=tiny_model, port=BASE, nccl_port=BASE + 1000, mode="prefill", bootstrap_port=BOOT,
        extra=["--pdd-role", "prefill"]))
    mds = [server_group.start(f"choice-main-{i}", ServerConfig(
        model=tiny_model, port=BASE + 1 + i, nccl_port=BASE + 1001 + i, mode="decode", bootstrap_port=BOOT,
        decode_radix_cache=True, extra=["--pdd-role", "main"])) for i in range(2)]
    for s in (p, *mds):
        s.wait_ready()
    routers = {}
    for i, policy in enumerate(("cache-aware", "least-loaded")):
        routers[policy] = server_group.start(f"choice-router-{policy}", PddRouterConfig(
            prefill=[(p.url, BOOT)], relay=[], main=[m.url for m in mds], tokenizer=tiny_model,
            port=BASE + 10 + i, pipeline="direct", extra=["--peer-policy", policy, "--load-poll-s", "0.2"]))
    for r in routers.values():
        r.wait_ready()
    return p, mds, routers


def kv_sent(prefill) -> float:
    return sum(v for k, v in metric(prefill.url, "sglang_pdd_transfer_bytes_total").items()
               if dict(k).get("kind") == "kv")


def wait_idle(router, timeout_s: float = 60.0) -> None:
    """Until the router sees no load on any MD (its own requests and MD's polled gauges)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loads = metric(router.url, "sglang_pdd_router_peer_load")
        if loads and all(v == 0 for k, v in loads.items() if dict(k).get("role") == "main"):
            return
        time.sleep(0.1)
    raise AssertionError(f"MDs still loaded: {loads}")


class Blocker:
    """A long streamed request through the router, held open until closed."""

    def __init__(self, router, ids):
        body = {**greedy_body(ids, 3000), "stream": True}
        req = urllib.request.Request(router.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        self.resp = urllib.request.urlopen(req, timeout=300)
        for raw in self.resp:  # its first tokens: it runs on an MD now
            line = raw.decode().strip()
            if line.startswith("data:") and "output_ids" in line:
                self.md = json.loads(line[5:])["meta_info"]["pdd"]["md"]["index"]
                return
        raise AssertionError("the blocker's stream ended before any token")

    def close(self) -> None:
        self.resp.close()


def conversation(two_md, reference_server, prompts, policy: str, seed: int) -> dict:
    p, _mds, routers = two_md
    router = routers[policy]
    wait_idle(router)
    first = prompts.ids(1200, seed=seed)
    blocker = Blocker(router, prompts.ids(100, seed=seed + 1))
    try:
        out1 = generate(router.url, greedy_body(first, NEW_TOKENS))
    finally:
        blocker.close()
    home = 1 - blocker.md
    assert out1["meta_info"]["pdd"]["md"]["index"] == home, out1["meta_info"]["pdd"]  # the other MD was busy
    identity.check(identity.reference(reference_server.url, first, NEW_TOKENS), out1["output_ids"], "turn 1")
    wait_idle(router)
    second = first + out1["output_ids"] + prompts.ids(100, seed=seed + 2)
    hold = Blocker(router, first[:600])  # the home MD busier than the other during turn 2
    try:
        assert hold.md == home, "the second blocker went to the MD without the conversation"
        before = kv_sent(p)
        out2 = generate(router.url, greedy_body(second, NEW_TOKENS))
        moved = kv_sent(p) - before
    finally:
        hold.close()
    identity.check(identity.reference(reference_server.url, second, NEW_TOKENS), out2["output_ids"], "turn 2")
    return {"md": out2["meta_info"]["pdd"]["md"], "home": home, "moved": moved, "len": len(second),
            "cached": out2["meta_info"].get("cached_tokens")}


def test_cache_aware_keeps_the_conversation_on_its_md_least_loaded_does_not(two_md, reference_server, prompts,
                                                                            tiny_model):
    kvb = kv_bytes_per_token(tiny_model)
    aware = conversation(two_md, reference_server, prompts, "cache-aware", seed=41)
    control = conversation(two_md, reference_server, prompts, "least-loaded", seed=51)
    # cache-aware: turn 2 on the MD that holds turn 1's prompt and output (but its last token's KV)
    home, away = aware["home"], 1 - aware["home"]
    assert aware["md"]["index"] == home and "cache-aware" in aware["md"]["reason"]
    assert aware["md"]["hits"][home] >= 1200 + NEW_TOKENS - 1 and aware["md"]["hits"][away] == 0
    assert aware["moved"] <= (aware["len"] - 1200 - NEW_TOKENS + 1) * kvb
    # least-loaded: turn 2 goes to the idler MD, whose cache has none of it: the whole history crosses again
    assert control["md"]["index"] != control["home"], control
    assert control["moved"] >= control["len"] * kvb * 0.9
    assert aware["moved"] * 5 < control["moved"], (aware, control)
    print(f"\nturn 2 of {aware['len']} tokens: cache-aware MD hit {aware['md']['hits'][home]}, KV sent "
          f"{aware['moved'] / 2**20:.2f} MiB; least-loaded MD hit {control['md']['hits'][control['md']['index']]}, KV sent "
          f"{control['moved'] / 2**20:.2f} MiB ({control['moved'] / max(aware['moved'], 1):.1f}x)")
    sent = metric(two_md[2]["cache-aware"].url, "sglang_pdd_router_md_prompt_tokens_total")
    assert sum(v for k, v in sent.items() if dict(k).get("cached") == "hit") >= 1200 + NEW_TOKENS - 1
