"""The fan-out e2e harness: one prefill (`--pdd-role prefill`), a relay decode and a main decode
with the decode radix cache, started by hand in the test's namespace, and the clients and byte
counters the fan-out tests read (tests/e2e/test_fanout.py)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass

import pytest

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.protocol import room_plan
from sglang_pdd.lab.testing.pdd_client import signer_from_env
from sglang_pdd.lab.testing import identity
from sglang_pdd.lab.testing.client import generate, greedy_body
from sglang_pdd.lab.testing.launch_args import ServerConfig
from sglang_pdd.lab.testing.servers import ServerGroup, ServerProcess, http_json
from sglang_pdd.transfer.pool_state import KEY as POOL_KEY
from sglang_pdd.transfer.pool_state import idle_problems

from .cluster import kv_bytes_per_token


NEW_TOKENS = 16
PAGE64_CHUNK = 128  # P's --chunked-prefill-size with pages of 64: two pages a chunk
MAIN_BOOTSTRAP_TIMEOUT = 6  # --pdd-main-bootstrap-timeout of P, seconds
SLOW_MAIN_WRITE = 4.0  # seconds P sleeps before each KV write to the main (knob), for abort / kill
FIGURES: dict[str, object] = {}


@dataclass
class Fanout:
    prefill: ServerProcess
    relay: ServerProcess
    main: ServerProcess
    bootstrap_port: int
    page_size: int
    kvb: int  # KV bytes per token
    knobs: str  # P's test-knobs file
    main_cached: list  # token sequences the main decode's radix cache holds (prompt + output but the last)

    def set_knobs(self, **knobs) -> None:
        with open(self.knobs + ".tmp", "w") as f:
            json.dump(knobs, f)
        os.replace(self.knobs + ".tmp", self.knobs)

    def pages_bytes(self, tokens: int) -> int:
        return math.ceil(tokens / self.page_size) * self.page_size * self.kvb

    def main_served(self, ids: list[int], result) -> None:
        if isinstance(result, dict) and result["meta_info"]["finish_reason"]["type"] != "abort":
            self.main_cached.append(list(ids) + result["output_ids"][:-1])

    def main_prefix(self, ids: list[int]) -> int:
        """The main decode's radix-cache hit for `ids`: the longest cached prefix, in whole pages."""
        best = 0
        for seq in self.main_cached:
            n = 0
            for a, b in zip(ids, seq[: len(seq) // self.page_size * self.page_size]):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best // self.page_size * self.page_size

    def main_miss_bytes(self, ids: list[int]) -> int:
        return self.pages_bytes(len(ids)) - self.main_prefix(ids) * self.kvb


def start_fanout(log_dir: str, model: str, *, page_size: int, base: int, boot: int, prefill_chunk: int = -1):
    group = ServerGroup(log_dir, grace_s=0)
    knobs = os.path.join(log_dir, f"fanout-knobs-{base}.json")
    common = dict(model=model, bootstrap_port=boot, page_size=page_size)
    p = group.start(f"fanout-prefill-{base}", ServerConfig(
        port=base, nccl_port=base + 1000, mode="prefill", chunked_prefill_size=prefill_chunk, **common,
        extra=["--pdd-role", "prefill", "--pdd-main-bootstrap-timeout", str(MAIN_BOOTSTRAP_TIMEOUT)],
        env={"SGLANG_PDD_TEST_KNOBS": knobs}))
    relay = group.start(f"fanout-relay-{base + 1}", ServerConfig(
        port=base + 1, nccl_port=base + 1001, mode="decode", **common))
    main = group.start(f"fanout-main-{base + 2}", ServerConfig(
        port=base + 2, nccl_port=base + 1002, mode="decode", decode_radix_cache=True, **common))
    for s in (p, relay, main):
        s.wait_ready()
    return group, Fanout(p, relay, main, boot, page_size, kv_bytes_per_token(model), knobs, [])


@pytest.fixture(scope="class")
def fan1(private_netns, tiny_model, log_dir):
    group, fan = start_fanout(log_dir, tiny_model, page_size=1, base=30800, boot=8995)
    with group:
        yield fan


@pytest.fixture(scope="class")
def fan64(private_netns, tiny_model, log_dir):
    """Pages of 64 and P's chunked prefill of 128: a 400-token prompt leaves P in 4 chunks. (Pages of 16
    with P's chunked prefill fan out in tests/e2e/test_relay_handoff.py, P -> RLD + MD.)"""
    group, fan = start_fanout(log_dir, tiny_model, page_size=64, base=30900, boot=8994,
                              prefill_chunk=PAGE64_CHUNK)
    with group:
        yield fan


@pytest.fixture(scope="module", autouse=True)
def figures(log_dir):
    yield
    with open(os.path.join(log_dir, "fanout_figures.json"), "w") as f:
        json.dump(FIGURES, f, indent=1, sort_keys=True)


# ---- clients -------------------------------------------------------------------------------------

def with_pdd(body: dict, pdd: object) -> dict:
    sp = dict(body["sampling_params"])
    sp["custom_params"] = {"pdd": pdd}
    return {**body, "sampling_params": sp}


def fanout_generate(fan: Fanout, ids: list[int], *, send_main: bool = True, after_relay=None) -> dict:
    """P (room R, main_room R2), relay (R) and main (R2) at once; each result or its exception, and
    when it came back (seconds after sending). `after_relay(out)` runs once the relay answered."""
    # the fan-out alone: MD is a plain decode, told of no relay (no token channel)
    plan = room_plan.plan(greedy_body(ids, NEW_TOKENS), Pipeline.P_RLD_MD, "127.0.0.1", fan.bootstrap_port,
                          signer=signer_from_env())
    main_rid = f"fanout-main-{plan.main_room}"
    calls = {"prefill": (fan.prefill.url, plan.bodies["prefill"]), "relay": (fan.relay.url, plan.bodies["relay"])}
    if send_main:
        calls["main"] = (fan.main.url, {**plan.bodies["main"], "rid": main_rid})
    out: dict[str, object] = {"main_rid": main_rid, "main_body": plan.bodies["main"]}
    t0 = time.monotonic()

    def call(name: str, url: str, b: dict) -> None:
        try:
            out[name] = generate(url, b)
        except Exception as e:  # inspected by the caller
            out[name] = e
        out[name + "_s"] = round(time.monotonic() - t0, 2)

    threads = {n: threading.Thread(target=call, args=(n, u, b)) for n, (u, b) in calls.items()}
    for t in threads.values():
        t.start()
    threads["relay"].join()
    if after_relay is not None:
        after_relay(out)
    for t in threads.values():
        t.join()
    if send_main:
        fan.main_served(ids, out["main"])
    return out


def ids_of(result) -> list[int]:
    if isinstance(result, Exception):
        raise result
    return result["output_ids"]


def reference(server, ids: list[int]) -> identity.Reference:
    return identity.reference(server.url, ids, NEW_TOKENS)


def assert_same(want: identity.Reference, result, what: str) -> None:
    identity.check(want, ids_of(result), what)


def path_bytes(fan: Fanout) -> dict[tuple[str, str], int]:
    status, text = http_json(fan.prefill.url + "/metrics")
    assert status == 200
    out: dict[tuple[str, str], int] = {}
    for labels, v in parse_exposition(text, "sglang_pdd_transfer_bytes_total").items():
        d = dict(labels)
        out[(d["path"], d["kind"])] = out.get((d["path"], d["kind"]), 0) + int(v)
    return out


def moved(before: dict, after: dict, path: str, kind: str = "kv") -> int:
    return after.get((path, kind), 0) - before.get((path, kind), 0)


def prefill_pool(fan: Fanout) -> dict:
    status, info = http_json(fan.prefill.url + "/get_server_info")
    assert status == 200, info
    return info["internal_states"][0][POOL_KEY]


def assert_prefill_idle(fan: Fanout, wait_s: float = 60.0) -> None:
    """P holds no KV page, row, metadata slot or room once its requests are done (polls for it)."""
    deadline = time.monotonic() + wait_s
    while True:
        state = prefill_pool(fan)
        problems = idle_problems(state)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems, (problems, state)


def conversation_bytes(fan: Fanout, ref_server, prompts, seed: int) -> dict:
    """Turn 1, turn 2 (history + new text), and the turn-1 prompt again; the main's KV bytes are
    exactly the pages past its radix-cache hit, the relay's the whole prompt."""
    figures = {}
    first = prompts.ids(400, seed=seed)
    second = None
    for turn in ("turn1", "turn2", "repeat"):
        ids = {"turn1": first, "turn2": second, "repeat": first}[turn]
        expected_prefix = fan.main_prefix(ids)
        before = path_bytes(fan)
        r = fanout_generate(fan, ids)
        after = path_bytes(fan)
        want = reference(ref_server, ids)
        assert_same(want, r["relay"], f"{turn}: the relay")
        assert_same(want, r["main"], f"{turn}: the main (its fan-out leg)")
        relay_kv, main_kv = moved(before, after, "relay"), moved(before, after, "main")
        assert relay_kv == fan.pages_bytes(len(ids)), turn
        assert main_kv == fan.pages_bytes(len(ids)) - expected_prefix * fan.kvb, (turn, main_kv, expected_prefix)
        assert moved(before, after, "main", "aux") > 0, turn  # the metadata row always goes
        figures[turn] = {"tokens": len(ids), "main_prefix": expected_prefix, "relay_kv": relay_kv,
                         "main_kv": main_kv, "main_aux": moved(before, after, "main", "aux")}
        if turn == "turn1":
            second = first + ids_of(r["relay"]) + prompts.ids(60, seed=seed + 1)
    # turn 2: the main cached turn 1's prompt and output but its last token: it gets the appended text
    assert figures["turn2"]["main_prefix"] == (len(first) + NEW_TOKENS - 1) // fan.page_size * fan.page_size
    assert figures["repeat"]["main_prefix"] == len(first) // fan.page_size * fan.page_size
    assert_prefill_idle(fan)
    return figures
