"""A relay or main process that dies and starts again, and junk at the token channel (issue 31): on
real sglang, the next relayed request hands over normally and is token-identical, without restarting
the other side. The servers are test_relay_handoff's (shared_cluster.OVERLAP: RLD and MD on sglang's
overlap loop, pages of 16), taken over after it: these tests replace its RLD and MD processes."""

import time

import pytest

from sglang_pdd.lab.testing.client import greedy_body

from .cluster import decode_roles_idle, junk_at, metric
from .relay_checks import assert_identical, ref, relayed
from .shared_cluster import OVERLAP, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(OVERLAP)]


@pytest.fixture(scope="module")
def pdd(request, shared_clusters, tiny_model):
    return cluster_for(request, shared_clusters, tiny_model)


@pytest.fixture(scope="module")
def reference_server(pdd):
    """A single server on the decode roles' loop (test_relay_handoff's reference)."""
    return pdd.reference


def test_a_restarted_relay_hands_over_again_without_restarting_main(pdd, reference_server, prompts):
    """RLD dies (SIGKILL) and starts again with the same command line (issue 31): the next relayed
    request hands over normally, token-identical, within its deadline. Before the relay's replies carried
    its epoch, MD dropped every reply of the new process as a replay ("reply 1 seen already") and each
    relayed request waited out MD's handoff timeout, until MD itself restarted. Late in the module: it
    replaces the relay process the other tests used."""
    def replay_drops() -> float:
        return sum(v for k, v in metric(pdd.main.url, "sglang_pdd_token_channel_rejected_total").items()
                   if dict(k).get("reason") == "replay")

    ids = prompts.ids(300, seed=91)
    want = ref(reference_server, ids, 40)
    assert_identical(want, relayed(pdd, greedy_body(ids, 40), k=4), "before the restart")
    drops = replay_drops()
    pdd.relay.stop(grace_s=0)
    assert not pdd.relay.alive()
    pdd.relay.start().wait_ready()
    r = relayed(pdd, greedy_body(ids, 40), k=5)  # a handoff (asserted there): MD did not time out
    assert_identical(want, r, "after the relay restarted")
    assert replay_drops() == drops
    ids2 = prompts.ids(260, seed=92)  # a second request: the channel stays up
    assert_identical(ref(reference_server, ids2, 30), relayed(pdd, greedy_body(ids2, 30), k=3), "second after")
    assert decode_roles_idle(pdd) == []


# -- the token channel under junk and a restarted MD (issue 31 item 4) -------------------------------

def rejected_on_relay(pdd) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in metric(pdd.relay.url, "sglang_pdd_token_channel_rejected_total").items()
            if dict(k).get("role") == "relay"}


def test_a_flood_of_junk_at_the_token_port_leaves_the_next_handoff_intact(pdd, reference_server, prompts):
    """Unauthenticated garbage at RLD's token port (`junk_at`): bytes that are not ZMTP, then 300 frames
    of 1 MiB and 20 three-part messages from a ZMQ peer without the secret. RLD reads and drops every
    one (counted: bad_mac, malformed; the raw bytes may add some, read as ZMTP 1.0 frames), stays up,
    and the next relayed request hands over normally."""
    ids = prompts.ids(200, seed=97)
    want = ref(reference_server, ids, 40)
    before, sent = rejected_on_relay(pdd), {"bad_mac": 300, "malformed": 20}
    with junk_at(pdd.token_port, frames=sent["bad_mac"], size=1 << 20, parts=sent["malformed"]):
        deadline = time.monotonic() + 120
        while True:  # RLD drains them at its own pace (32 MiB per poll)
            grew = {r: rejected_on_relay(pdd).get(r, 0) - before.get(r, 0) for r in sent}
            if all(grew[r] >= n for r, n in sent.items()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert all(grew[r] >= n for r, n in sent.items()) and pdd.relay.alive(), grew
    assert_identical(want, relayed(pdd, greedy_body(ids, 40), k=5), "after the junk")
    assert decode_roles_idle(pdd) == []


def test_a_restarted_main_hands_over_again(pdd, reference_server, prompts):
    """MD dies (SIGKILL) and starts again with the same command line: its new process connects to the
    relay under a new session, and the next relayed request hands over normally, token-identical.
    Last in the module: it replaces the MD process the other tests used."""
    ids = prompts.ids(240, seed=98)
    want = ref(reference_server, ids, 40)
    assert_identical(want, relayed(pdd, greedy_body(ids, 40), k=4), "before MD restarted")
    pdd.main.stop(grace_s=0)
    assert not pdd.main.alive()
    pdd.main.start().wait_ready()
    assert_identical(want, relayed(pdd, greedy_body(ids, 40), k=6), "after MD restarted")
    ids2 = prompts.ids(180, seed=99)
    assert_identical(ref(reference_server, ids2, 30), relayed(pdd, greedy_body(ids2, 30), k=3), "second after")
    assert decode_roles_idle(pdd) == []
