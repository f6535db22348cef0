"""The plugin on sglang with patches/ applied, end to end: P, RLD and MD (packed WAN path on) and two
routers start with a patched copy of the installed sglang first on PYTHONPATH
(sglang_pdd.lab.testing.patched_sglang), so the plugin takes the series' extension points instead of
the hooks they retire (plugin.CAPABILITIES). Every server reports that choice in /get_server_info,
and RLD and MD that sglang's decode scheduler extension (patch 0003) serves their runtime, the six
decode hooks being unregistered; token identity against a single (stock) server, with a handoff,
P's fan-out to RLD and MD and the packed main leg each observed on the servers' counters, is the proof. One cluster for the module
(CI time): about 2 minutes with its start-up.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from sglang_pdd.decode import extension as decode_extension
from sglang_pdd import plugin
from sglang_pdd.process_state.capabilities import KEY as CAPABILITIES_KEY
from sglang_pdd.lab.testing import identity, patched_sglang
from sglang_pdd.lab.testing.client import greedy_body
from sglang_pdd.lab.testing.launch_args import PddRouterConfig
from sglang_pdd.lab.testing.servers import http_json
from sglang_pdd.protocol.reply import ReplyMeta

from .cluster import by_state, metric, start_pdd
from .fanout_cluster import assert_prefill_idle, with_pdd

pytestmark = pytest.mark.e2e

BASE, BOOT, TOKEN_PORT = 31700, 8988, 18660
PAGE = 16
N = 96  # RLD hands over at k >= 4 (its knob) long before that (as in test_pdd_router)


@pytest.fixture(scope="module")
def patched(patched_sglang_root, reference_server):
    """PYTHONPATH with the patched copy first, for every server this module starts (the reference
    single server is up before: it stays stock sglang)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", patched_sglang.environ(patched_sglang_root)["PYTHONPATH"])
    yield patched_sglang_root
    mp.undo()


@pytest.fixture(scope="module")
def cluster(patched, server_group, tiny_model):
    flags = ("--pdd-packed-wan", "plain")
    pdd = start_pdd(server_group, tiny_model, base_port=BASE, bootstrap_port=BOOT, token_port=TOKEN_PORT,
                    handoff_timeout=20, page_size=PAGE, prefill_extra=flags, main_extra=flags)
    pdd.set_knobs("relay", relay_min_eager=4)

    def router(name, port, pipeline):
        return server_group.start(name, PddRouterConfig(
            prefill=[(pdd.prefill.url, BOOT)], relay=[(pdd.relay.url, TOKEN_PORT)], main=[pdd.main.url],
            tokenizer=tiny_model, port=port, pipeline=pipeline, openai_frontend="builtin"))

    routers = {"relay": router("patched-router", BASE + 3, "relay"), "direct": router("patched-router-direct", BASE + 4,
                                                                                       "direct")}
    for r in routers.values():  # launched together, then waited for: their start-ups overlap
        r.wait_ready()
    return {"pdd": pdd, **routers}


def counters(c) -> dict[str, float]:
    """What shows a handoff, P's fan-out legs and the packed path: MD's handoffs, P's KV bytes per path,
    P's packed chunks, MD's unpacked rooms."""
    p, md = c["pdd"].prefill.url, c["pdd"].main.url
    out = {"handoffs": sum(metric(md, "sglang_pdd_handoffs_total").values())}
    for labels, v in metric(p, "sglang_pdd_transfer_bytes_total").items():
        d = dict(labels)
        if d.get("kind") == "kv":
            out[f"kv_{d['path']}"] = out.get(f"kv_{d['path']}", 0.0) + v
    for url, side, event in ((p, "prefill", "packed"), (md, "main", "unpacked")):
        out[event] = sum(v for k, v in metric(url, "sglang_pdd_packed_wan_events_total").items()
                         if dict(k).get("side") == side and dict(k).get("event") == event)
    return out


def grew(before: dict, after: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def generate(c, pipeline: str, reference_server, ids) -> tuple[ReplyMeta, dict, dict]:
    want = identity.reference(reference_server.url, ids, N)
    before = counters(c)
    status, out = http_json(c[pipeline].url + "/generate", greedy_body(ids, N))
    assert status == 200, out
    identity.check(want, out["output_ids"], f"patched sglang, router {pipeline}")
    assert out["meta_info"]["completion_tokens"] == N
    return ReplyMeta.of(out["meta_info"]), before, counters(c)


def test_every_server_takes_the_extension_points(cluster):
    want = {c.name: True for c in plugin.CAPABILITIES}
    pdd = cluster["pdd"]
    for server, decode_path in ((pdd.prefill, None), (pdd.relay, "extension"), (pdd.main, "extension")):
        status, info = http_json(server.url + "/get_server_info")
        assert status == 200, info
        state = info["internal_states"][0]
        assert state[CAPABILITIES_KEY] == want, (server.name, state)
        assert state.get(decode_extension.KEY) == decode_path, (server.name, state)  # RLD's, MD's runtime


def test_relayed_request_is_token_identical_through_the_fanout_and_the_packed_main_leg(
        cluster, reference_server, prompts):
    meta, before, after = generate(cluster, "relay", reference_server, prompts.ids(300, seed=1701))
    assert meta.pipeline == "P->RLD->MD" and meta.handoff_tokens >= 4, meta
    assert grew(before, after, "handoffs") == 1, (before, after)
    assert grew(before, after, "kv_relay") > 0 and grew(before, after, "kv_main") > 0, (before, after)  # fan-out
    assert grew(before, after, "packed") > 0 and grew(before, after, "unpacked") == 1, (before, after)


def test_direct_request_is_token_identical_through_the_packed_path(cluster, reference_server, prompts):
    check_direct(cluster, reference_server, prompts.ids(200, seed=1702))


def check_direct(cluster, reference_server, ids) -> None:
    meta, before, after = generate(cluster, "direct", reference_server, ids)
    assert meta.pipeline == "P->MD" and meta.handoff_tokens is None, meta
    assert grew(before, after, "handoffs") == 0 and grew(before, after, "kv_direct") > 0, (before, after)
    assert grew(before, after, "packed") > 0 and grew(before, after, "unpacked") == 1, (before, after)


def test_a_malformed_pdd_parameter_is_a_400_from_p_and_its_decode_is_told(cluster, reference_server, prompts):
    pdd = cluster["pdd"]
    body = {**greedy_body(prompts.ids(40, seed=1703), 4), "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT,
            "bootstrap_room": 17031}
    decode: dict = {}
    t = threading.Thread(target=lambda: decode.update(r=http_json(pdd.main.url + "/generate", body, timeout=120)))
    t.start()  # MD got the request too: P must tell it the room failed, not leave it waiting for KV
    status, out = http_json(pdd.prefill.url + "/generate", with_pdd(body, {"v": 1, "main_room": 17031}), timeout=60)
    t.join()
    assert status == 400 and "must differ from bootstrap_room" in json.dumps(out), (status, out)
    assert decode["r"][0] != 200, decode
    assert pdd.prefill.alive() and pdd.main.alive()
    check_direct(cluster, reference_server, prompts.ids(200, seed=1704))  # and both go on serving


def test_prefill_and_decodes_are_idle_after_the_requests(cluster):
    pdd = cluster["pdd"]
    assert_prefill_idle(pdd)  # no KV page, row, metadata slot or room left on P (polls for it)
    for url in (pdd.relay.url, pdd.main.url):  # every request row free again (polls for it)
        deadline = time.monotonic() + 60
        while by_state(url, "sglang_pdd_req_rows").get("free") != pdd.idle_rows[url] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert by_state(url, "sglang_pdd_req_rows").get("free") == pdd.idle_rows[url], url
