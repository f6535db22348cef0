"""P's fan-out on real sglang: one prefill (`--pdd-role prefill`) sends each request's KV to a relay
decode (all of it) and a main decode with the decode radix cache (only the pages it lacks), each on
its own bootstrap room. Both decodes are stock sglang; requests are sent by hand, as the router will:
the same body to P and the relay with room R, to the main with room R2, P's carrying
custom_params {"pdd": {"v": 1, "main_room": R2}}.

Checks: both greedy outputs equal a single server's; the main's KV bytes are exactly its missed pages
while the relay gets the whole prompt (page size 1 and 16); a main aborted or killed mid-transfer or
never bootstrapping leaves the relay correct and P's pool idle; a malformed `pdd` parameter fails
that request only; and, as a negative control, a main that misses one page more is caught by both
the byte and the token comparison. A slow WAN write and the extra skipped page come from the
test-only knobs file (config.TestKnobs, SGLANG_PDD_TEST_KNOBS) that P re-reads.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass

import pytest

from sglang_pdd.metrics import parse_exposition
from sglang_pdd.testing.client import generate, greedy_body, greedy_ids
from sglang_pdd.testing.launch_args import ServerConfig
from sglang_pdd.testing.servers import ServerGroup, ServerProcess, http_json
from sglang_pdd.transfer.pool_state import KEY as POOL_KEY
from sglang_pdd.transfer.pool_state import idle_problems

from .cluster import kv_bytes_per_token

pytestmark = pytest.mark.e2e

NEW_TOKENS = 16
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


def start_fanout(log_dir: str, model: str, *, page_size: int, base: int, boot: int):
    group = ServerGroup(log_dir)
    knobs = os.path.join(log_dir, f"fanout-knobs-{base}.json")
    common = dict(model=model, bootstrap_port=boot, page_size=page_size)
    p = group.start(f"fanout-prefill-{base}", ServerConfig(
        port=base, nccl_port=base + 1000, mode="prefill", **common,
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
def fan16(private_netns, tiny_model, log_dir):
    group, fan = start_fanout(log_dir, tiny_model, page_size=16, base=30900, boot=8994)
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
    room, room2 = random.getrandbits(63), random.getrandbits(63)
    body = {**greedy_body(ids, NEW_TOKENS), "bootstrap_host": "127.0.0.1", "bootstrap_port": fan.bootstrap_port}
    calls = {"prefill": (fan.prefill.url, with_pdd({**body, "bootstrap_room": room}, {"v": 1, "main_room": room2})),
             "relay": (fan.relay.url, {**body, "bootstrap_room": room})}
    if send_main:
        calls["main"] = (fan.main.url, {**body, "bootstrap_room": room2, "rid": f"fanout-main-{room2}"})
    out: dict[str, object] = {"main_rid": f"fanout-main-{room2}", "main_body": {**body, "bootstrap_room": room2}}
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


def conversation_bytes(fan: Fanout, reference, prompts, seed: int) -> dict:
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
        expected = greedy_ids(reference.url, ids, NEW_TOKENS)
        assert ids_of(r["relay"]) == expected and ids_of(r["main"]) == expected, turn
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


# ---- page size 1 ---------------------------------------------------------------------------------

class TestPageSize1:
    def test_main_gets_exactly_its_missed_pages_and_both_outputs_match_a_single_server(
            self, fan1, reference_server, prompts):
        FIGURES["page1"] = conversation_bytes(fan1, reference_server, prompts, seed=801)
        assert FIGURES["page1"]["repeat"]["main_kv"] == 0

    def test_concurrent_fanouts_are_independent(self, fan1, reference_server, prompts):
        cases = [prompts.ids(n, seed=810 + n) for n in (90, 300, 700)]
        results: list[dict] = [None] * len(cases)

        def one(i):
            results[i] = fanout_generate(fan1, cases[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for ids, r in zip(cases, results):
            expected = greedy_ids(reference_server.url, ids, NEW_TOKENS)
            assert ids_of(r["relay"]) == expected and ids_of(r["main"]) == expected
        assert_prefill_idle(fan1)

    def test_request_without_main_room_is_plain_pd(self, fan1, reference_server, prompts):
        ids = prompts.ids(200, seed=820)
        room = random.getrandbits(63)
        body = {**greedy_body(ids, NEW_TOKENS), "bootstrap_host": "127.0.0.1",
                "bootstrap_port": fan1.bootstrap_port, "bootstrap_room": room}
        expected_kv = fan1.main_miss_bytes(ids)
        before = path_bytes(fan1)
        got: dict = {}
        t = threading.Thread(target=lambda: got.update(p=generate(fan1.prefill.url, body)))
        t.start()
        res = generate(fan1.main.url, body)  # the main decode as a plain PD decode
        t.join()
        fan1.main_served(ids, res)
        after = path_bytes(fan1)
        assert res["output_ids"] == greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert moved(before, after, "direct") == expected_kv
        assert moved(before, after, "main") == 0 and moved(before, after, "relay") == 0
        assert_prefill_idle(fan1)

    @pytest.mark.parametrize("pdd, words", [
        ({"v": 1, "main_room": "not-a-room"}, "main_room"),
        ({"v": 9, "main_room": 5}, "version"),
        ("main_room=5", "pdd"),
    ])
    def test_malformed_pdd_param_fails_that_request_only(self, fan1, reference_server, prompts, pdd, words):
        ids = prompts.ids(30, seed=830)
        body = {**greedy_body(ids, 4), "bootstrap_host": "127.0.0.1", "bootstrap_port": fan1.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}
        relay: dict = {}
        t = threading.Thread(target=lambda: relay.update(
            r=http_json(fan1.relay.url + "/generate", body, timeout=120)))  # the relay got it too
        t.start()
        status, out = http_json(fan1.prefill.url + "/generate", with_pdd(body, pdd), timeout=60)
        t.join()
        assert status == 400 and words in json.dumps(out), (status, out)
        assert relay["r"][0] != 200, relay  # told the room failed, not left waiting for KV
        assert fan1.prefill.alive() and fan1.relay.alive()
        assert_prefill_idle(fan1)  # no room of it left in P's tables
        r = fanout_generate(fan1, ids)
        assert ids_of(r["relay"]) == greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert_prefill_idle(fan1)

    def test_main_that_never_bootstraps_is_given_up_after_the_timeout(self, fan1, reference_server, prompts):
        ids = prompts.ids(250, seed=840)
        before = path_bytes(fan1)
        r = fanout_generate(fan1, ids, send_main=False)
        after = path_bytes(fan1)
        assert ids_of(r["relay"]) == greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert not isinstance(r["prefill"], Exception), r["prefill"]  # the relay path succeeded
        assert moved(before, after, "main") == 0 and moved(before, after, "main", "aux") == 0
        assert_prefill_idle(fan1)
        # The main decode shows up after all: P refuses the room at once (else the main decode would
        # wait for KV until its own timeout, and P's tables would keep the room).
        t0 = time.monotonic()
        status, late = http_json(fan1.main.url + "/generate", r["main_body"], timeout=120)
        late_s = time.monotonic() - t0
        assert status != 200, late
        room2 = r["main_body"]["bootstrap_room"]
        assert f"room {room2}: refused the decode's registration" in fan1.prefill.log_text()
        assert_prefill_idle(fan1)
        FIGURES["never_bootstraps"] = {"relay_done_s": r["relay_s"], "prefill_released_s": r["prefill_s"],
                                       "timeout_s": MAIN_BOOTSTRAP_TIMEOUT,
                                       "late_main_refused_after_s": round(late_s, 2)}

    def test_slow_main_still_gets_its_kv_and_the_relay_is_served_from_stock_queues(
            self, fan1, reference_server, prompts):
        ids = prompts.ids(350, seed=845)
        expected_main_kv = fan1.main_miss_bytes(ids)
        fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
        try:
            before = path_bytes(fan1)
            r = fanout_generate(fan1, ids)
            after = path_bytes(fan1)
        finally:
            fan1.set_knobs()
        expected = greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert ids_of(r["relay"]) == expected and ids_of(r["main"]) == expected
        # "main" bytes are only ever counted on a main lane's thread, "relay" bytes never are: the
        # slow write ran on its own lane, not on a queue the relay's chunks wait on.
        assert moved(before, after, "main") == expected_main_kv
        assert moved(before, after, "relay") == fan1.pages_bytes(len(ids))
        assert_prefill_idle(fan1)
        FIGURES["slow_main"] = {"relay_done_s": r["relay_s"], "main_done_s": r["main_s"],
                                "prefill_released_s": r["prefill_s"], "slow_write_s": SLOW_MAIN_WRITE}

    def test_main_aborted_mid_transfer_leaves_the_relay_correct(self, fan1, reference_server, prompts):
        ids = prompts.ids(500, seed=850)
        fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
        try:
            r = fanout_generate(fan1, ids, after_relay=lambda out: http_json(
                fan1.main.url + "/abort_request", {"rid": out["main_rid"]}))
        finally:
            fan1.set_knobs()
        expected = greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert ids_of(r["relay"]) == expected
        assert not isinstance(r["prefill"], Exception), r["prefill"]
        main = r["main"]
        assert isinstance(main, Exception) or main["meta_info"]["finish_reason"]["type"] == "abort" \
            or main["output_ids"] == expected, main
        assert_prefill_idle(fan1)
        FIGURES["main_aborted"] = {"relay_done_s": r["relay_s"], "prefill_released_s": r["prefill_s"],
                                   "main_s": r["main_s"], "slow_write_s": SLOW_MAIN_WRITE,
                                   "main_result": "error" if isinstance(main, Exception)
                                   else main["meta_info"]["finish_reason"]}

    def test_main_killed_mid_transfer_leaves_the_relay_correct(self, fan1, reference_server, prompts):
        # last of the class: the main decode stays dead
        ids = prompts.ids(500, seed=860)
        fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
        try:
            r = fanout_generate(fan1, ids, after_relay=lambda out: os.killpg(fan1.main.proc.pid, signal.SIGKILL))
        finally:
            fan1.set_knobs()
        assert ids_of(r["relay"]) == greedy_ids(reference_server.url, ids, NEW_TOKENS)
        assert not isinstance(r["prefill"], Exception), r["prefill"]
        assert isinstance(r["main"], (Exception, dict))
        assert_prefill_idle(fan1)
        dead_write = re.search(r"Session \S+ failed\.", fan1.prefill.log_text())  # stock Mooncake's line
        FIGURES["main_killed"] = {"relay_done_s": r["relay_s"], "prefill_released_s": r["prefill_s"],
                                  "slow_write_s": SLOW_MAIN_WRITE, "write_to_dead_main_failed": bool(dead_write)}


# ---- page size 16 --------------------------------------------------------------------------------

class TestPageSize16:
    def test_main_gets_exactly_its_missed_pages_and_both_outputs_match_a_single_server(
            self, fan16, reference_server, prompts):
        FIGURES["page16"] = conversation_bytes(fan16, reference_server, prompts, seed=901)

    def test_negative_control_main_missing_one_page_is_caught(self, fan16, reference_server, prompts):
        # A short prompt never seen by the main (prefix 0), so one page is a third of its KV, and one
        # whose greedy output is not a single repeated token (those hardly depend on the KV).
        for seed in range(910, 940):
            ids = prompts.ids(48, seed=seed)
            expected = greedy_ids(reference_server.url, ids, NEW_TOKENS)
            if len(set(expected)) >= 4:
                break
        expected_main_kv = fan16.main_miss_bytes(ids)
        fan16.set_knobs(main_extra_skip_pages=1)
        try:
            before = path_bytes(fan16)
            r = fanout_generate(fan16, ids)
            after = path_bytes(fan16)
        finally:
            fan16.set_knobs()
        assert ids_of(r["relay"]) == expected
        main_kv = moved(before, after, "main")
        assert main_kv == expected_main_kv - 16 * fan16.kvb and main_kv != expected_main_kv  # the byte check fails
        assert ids_of(r["main"]) != expected  # and so does the token check
        assert_prefill_idle(fan16)
