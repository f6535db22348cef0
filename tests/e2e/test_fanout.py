"""P's fan-out on real sglang: one prefill (`--pdd-role prefill`) sends each request's KV to a relay
decode (all of it) and a main decode with the decode radix cache (only the pages it lacks), each on
its own bootstrap room. Both decodes are stock sglang; requests are sent by hand, as the router will:
the same body to P and the relay with room R, to the main with room R2, P's carrying
custom_params {"pdd": {"v": 1, "main_room": R2}}.

Checks: both greedy outputs equal a single server's; the main's KV bytes are exactly its missed pages
while the relay gets the whole prompt (pages of 1; pages of 64 with P's chunked prefill of 128,
prompts of several chunks); a main aborted or killed mid-transfer or never bootstrapping leaves the
relay correct and P's pool idle; P's main lane gauge holds a slow write's bytes until they are written;
a malformed `pdd` parameter fails that request only; and, as negative
controls, a main that misses one page more (the first it lacks, on a prompt it has never seen or past
3 pages it caches) is caught by both the byte and the token comparison. A slow WAN write and the extra
skipped page come from the test-only knobs file (test_switches.TestKnobs, SGLANG_PDD_TEST_KNOBS) that
P re-reads.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time

import pytest

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.protocol.request import RequestParams
from sglang_pdd.lab.testing.pdd_client import signer_from_env
from sglang_pdd.lab.testing.client import generate, greedy_body
from sglang_pdd.lab.testing.context_model import prompt_positions_read
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec

from .fanout_cluster import (  # noqa: F401  (fan1, fan64 and the autouse figures are fixtures)
    FIGURES, MAIN_BOOTSTRAP_TIMEOUT, NEW_TOKENS, SLOW_MAIN_WRITE, assert_prefill_idle, assert_same,
    conversation_bytes, fan1, fan64, fanout_generate, figures, ids_of, moved, path_bytes, reference, with_pdd)

pytestmark = pytest.mark.e2e

SPEC = TinyModelSpec()  # the test model's geometry (tests/conftest.py builds the default)


def lane_queued(fan) -> dict[str, float]:
    status, text = http_json(fan.prefill.url + "/metrics")
    assert status == 200
    return {dict(k).get("peer", ""): v for k, v in parse_exposition(text, "sglang_pdd_lane_queued_bytes").items()}


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
            want = reference(reference_server, ids)
            assert_same(want, r["relay"], "concurrent: the relay")
            assert_same(want, r["main"], "concurrent: the main")
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
        assert_same(reference(reference_server, ids), res, "plain PD on the main")
        assert moved(before, after, "direct") == expected_kv
        assert moved(before, after, "main") == 0 and moved(before, after, "relay") == 0
        assert_prefill_idle(fan1)

    @pytest.mark.parametrize("pdd, words", [
        ({"v": 1, "main_room": "not-a-room"}, "main_room"),
        ({"v": 9, "main_room": 5}, "version"),
        ("main_room=5", "pdd"),
        ({"v": 1, "main_room": 5}, "not signed"),  # a client's own main_room: P holds the secret
        (signer_from_env().sign(RequestParams(v=1, main_room=5), 12345).to_custom_params()["pdd"],
         "does not match"),  # the router's signature, but for another request's room
        ({"v": 1, "main_room": 5, "exp": 2**40, "sig": "\u00e9" * 32},
         "does not match"),  # a non-ASCII sig: compare_digest raised TypeError and killed P
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
        want = reference(reference_server, ids)
        assert_same(want, r["relay"], "after a malformed body: the relay")
        assert_same(want, r["main"], "after a malformed body: the main")
        assert_prefill_idle(fan1)

    def test_main_that_never_bootstraps_is_given_up_after_the_timeout(self, fan1, reference_server, prompts):
        ids = prompts.ids(250, seed=840)
        before = path_bytes(fan1)
        r = fanout_generate(fan1, ids, send_main=False)
        after = path_bytes(fan1)
        assert_same(reference(reference_server, ids), r["relay"], "the relay, no main")
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
        want = reference(reference_server, ids)
        assert_same(want, r["relay"], "slow main: the relay")
        assert_same(want, r["main"], "slow main: the main")
        # "main" bytes are only ever counted on a main lane's thread, "relay" bytes never are: the
        # slow write ran on its own lane, not on a queue the relay's chunks wait on.
        assert moved(before, after, "main") == expected_main_kv
        assert moved(before, after, "relay") == fan1.pages_bytes(len(ids))
        assert_prefill_idle(fan1)
        FIGURES["slow_main"] = {"relay_done_s": r["relay_s"], "main_done_s": r["main_s"],
                                "prefill_released_s": r["prefill_s"], "slow_write_s": SLOW_MAIN_WRITE}

    def test_the_lane_gauge_holds_the_main_leg_bytes_until_they_are_written(self, fan1, reference_server, prompts):
        """P's main lane shows the KV bytes it still holds for MD (`sglang_pdd_lane_queued_bytes`, which the
        router's queue-aware WAN prediction reads: policy.wan_queue, router.peers.bandwidth_feed): under a slow
        WAN write the request's main-leg chunk shows under MD's session while it is written, nothing once
        it is."""
        ids = prompts.ids(300, seed=861)  # never seen by MD: its whole prompt crosses
        expected = fan1.main_miss_bytes(ids)
        fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
        out: dict = {}
        try:
            before = path_bytes(fan1)
            t = threading.Thread(target=lambda: out.update(fanout_generate(fan1, ids)))
            t.start()
            peak: dict[str, float] = {}
            while t.is_alive():  # the request ends within its own deadline; the gauge is read meanwhile
                for peer, v in lane_queued(fan1).items():
                    peak[peer] = max(peak.get(peer, 0.0), v)
                time.sleep(0.1)
            t.join()
            after = path_bytes(fan1)
        finally:
            fan1.set_knobs()
        assert_same(reference(reference_server, ids), out["main"], "slow main: the main")
        main_kv = moved(before, after, "main")
        assert main_kv == expected > 0
        assert list(peak.values()) and max(peak.values()) == main_kv, peak  # one lane, the main's session
        deadline = time.monotonic() + 30  # the worker is back at its queue once the write is done
        while any(lane_queued(fan1).values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(lane_queued(fan1).values()), lane_queued(fan1)

    def test_main_aborted_mid_transfer_leaves_the_relay_correct(self, fan1, reference_server, prompts):
        ids = prompts.ids(500, seed=850)
        fan1.set_knobs(main_write_delay=SLOW_MAIN_WRITE)
        try:
            r = fanout_generate(fan1, ids, after_relay=lambda out: http_json(
                fan1.main.url + "/abort_request", {"rid": out["main_rid"]}))
        finally:
            fan1.set_knobs()
        assert_same(reference(reference_server, ids), r["relay"], "main aborted: the relay")
        assert not isinstance(r["prefill"], Exception), r["prefill"]
        main = r["main"]  # aborted while P held its write back: it never got its KV
        assert isinstance(main, Exception) or main["meta_info"]["finish_reason"]["type"] == "abort", main
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
        assert_same(reference(reference_server, ids), r["relay"], "main killed: the relay")
        assert not isinstance(r["prefill"], Exception), r["prefill"]
        assert isinstance(r["main"], Exception), r["main"]  # its connection died with it
        assert_prefill_idle(fan1)
        dead_write = re.search(r"Session \S+ failed\.", fan1.prefill.log_text())  # stock Mooncake's line
        assert dead_write, "P's write to the dead main did not fail"
        FIGURES["main_killed"] = {"relay_done_s": r["relay_s"], "prefill_released_s": r["prefill_s"],
                                  "slow_write_s": SLOW_MAIN_WRITE, "write_to_dead_main_failed": bool(dead_write)}


# ---- pages of 64, P's chunked prefill of 128 ------------------------------------------------------

class TestPageSize64ChunkedPrefill:
    def test_main_gets_exactly_its_missed_pages_and_both_outputs_match_a_single_server(
            self, fan64, reference_server, prompts):
        FIGURES["page64_chunk128"] = conversation_bytes(fan64, reference_server, prompts, seed=901)

    @pytest.mark.parametrize("cached", [0, 3], ids=["main-caches-nothing", "main-caches-3-pages"])
    def test_negative_control_main_missing_one_page_is_caught(self, fan64, reference_server, prompts, cached):
        """A 448-token prompt (7 pages; 4 of P's chunks, or 2 past P's own cache) of which the main
        caches `cached` pages; P withholds the next one too. That page must be one the main's decode
        steps read, or no output could show it: on this model page 0 under a 150-token prompt is read
        by none (context_model.prompt_positions_read), and a control built on it held (730b2a2). The
        main's cache keeps the control's prompt with its unfilled page: the controls run last."""
        head = []
        if cached:  # an earlier request leaves the main its pages; the control's prompt goes on with new text
            head = prompts.ids(cached * 64, seed=915)
            r = fanout_generate(fan64, head)
            assert_same(reference(reference_server, head), r["main"], "control's first request: the main")
        ids = head + prompts.ids(448 - len(head), seed=910)
        assert fan64.main_prefix(ids) == cached * 64
        withheld = set(range(cached * 64, (cached + 1) * 64))
        assert withheld & prompt_positions_read(len(ids), NEW_TOKENS - 1, SPEC.layers, SPEC.heads)
        want = reference(reference_server, ids)
        expected_main_kv = fan64.main_miss_bytes(ids)
        fan64.set_knobs(main_extra_skip_pages=1)
        try:
            before = path_bytes(fan64)
            r = fanout_generate(fan64, ids)
            after = path_bytes(fan64)
        finally:
            fan64.set_knobs()
        assert_same(want, r["relay"], "control: the relay")
        assert moved(before, after, "relay") == fan64.pages_bytes(len(ids))
        main_kv = moved(before, after, "main")
        assert main_kv == expected_main_kv - 64 * fan64.kvb and main_kv != expected_main_kv  # the byte check fails
        with pytest.raises(AssertionError, match="diverges from the single server"):  # and so does the token check
            assert_same(want, r["main"], "control: the main")
        assert_prefill_idle(fan64)
