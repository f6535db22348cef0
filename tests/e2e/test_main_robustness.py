"""MainDecode on real sglang stays up and clean whatever one request does: a relay it was not told
about ends that request with a clear error (the next request is served), and clients that go away
before their KV landed leave MD's handoff tables, request rows and KV pool at their idle values.
The servers are test_kv_events' (shared_cluster.PAIR: P and MD, no RLD; MD trusts one relay nothing
serves), taken over after it."""

import json
import random
import socket

import pytest

from sglang_pdd.protocol.request import RequestParams, with_params
from sglang_pdd.lab.testing.pdd_client import signer_from_env
from sglang_pdd.lab.testing.client import greedy_body, greedy_ids, pd_generate
from sglang_pdd.lab.testing.servers import http_json

from .cluster import by_state, wait_until
from .shared_cluster import PAIR, PAIR_BOOT as BOOT, cluster_for
from .shared_cluster import PAIR_TRUSTED_RELAY as TRUSTED_RELAY  # named at MD's start-up; nothing listens there

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(PAIR)]

NEW = 8


@pytest.fixture(scope="module")
def pd(request, shared_clusters, tiny_model):
    return cluster_for(request, shared_clusters, tiny_model)


def free_kv(pd) -> float:
    """KV slots MD can hand out: free, or held only by its radix cache (evictable)."""
    kv = by_state(pd.decode.url, "sglang_pdd_kv_pool_tokens")
    return kv["available"] + kv["evictable"]


def relayed_body(ids, relay: str, room: int) -> dict:
    body = {**greedy_body(ids, NEW), "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT, "bootstrap_room": room}
    return with_params(body, signer_from_env().sign(RequestParams(v=1, relay_room=random.getrandbits(63), relay=relay),
                                                    room))


def test_an_untrusted_relay_ends_that_request_and_main_keeps_serving(pd, reference_server, prompts):
    ids = prompts.ids(40, seed=61)
    status, out = http_json(pd.decode.url + "/generate", relayed_body(ids, "tcp://nohost", random.getrandbits(63)),
                            timeout=60)
    assert status == 400, out
    assert "--pdd-relays" in out["error"]["message"] and "tcp://nohost" in out["error"]["message"]
    out = pd_generate(pd.prefill.url, pd.decode.url, "127.0.0.1", BOOT, greedy_body(ids, NEW))
    assert out["output_ids"] == greedy_ids(reference_server.url, ids, NEW)
    assert pd.decode.alive()


def open_stream(url: str, body: dict) -> socket.socket:
    """A streamed /generate whose client goes away when the socket is closed."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps({**body, "stream": True}).encode()
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


N_DISCONNECTS = 50  # the probe: 50 clients gone before their KV lands


def test_clients_that_leave_before_their_kv_lands_leave_main_idle(pd, prompts):
    idle_kv = wait_until(lambda: by_state(pd.decode.url, "sglang_pdd_kv_pool_tokens").get("total"),
                         "MD's KV pool published")
    # P is never asked for these rooms: MD admits each relayed request and waits for its KV.
    socks = [open_stream(pd.decode.url, relayed_body(prompts.ids(60, seed=70 + i), TRUSTED_RELAY,
                                                     random.getrandbits(63)))
             for i in range(N_DISCONNECTS)]
    states = lambda: by_state(pd.decode.url, "sglang_pdd_handoff_requests")  # noqa: E731
    wait_until(lambda: states().get("admitted", 0) == N_DISCONNECTS, "all relayed requests admitted")
    # the control: some of them got past the handshake and hold rows now, which the check below sees back
    wait_until(lambda: by_state(pd.decode.url, "sglang_pdd_req_rows")["free"] < pd.idle_rows, "rows taken")
    for s in socks:
        s.close()
    wait_until(lambda: states() and not any(states().values()), "MD's handoff tables empty")
    # Every row and KV slot back: the rows of those whose KV was on its way are held until P acknowledges
    # the abort or sglang's deferred-release timeout (30 s) passes.
    wait_until(lambda: by_state(pd.decode.url, "sglang_pdd_req_rows")["free"] == pd.idle_rows, "request rows free")
    wait_until(lambda: free_kv(pd) == idle_kv, "KV pool back to idle")
    assert pd.decode.alive()
