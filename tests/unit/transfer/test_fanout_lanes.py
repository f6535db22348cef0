"""Main lanes (MainDecode's chunks on their own queue and thread) and the fan-out's request parameters."""

import contextlib
import queue
import threading
from types import SimpleNamespace

import pytest

from sglang_pdd.transfer.lanes import FanoutRegistry, MainLanes
from sglang_pdd.transfer.mooncake_fanout import FanoutBuilder, FanoutParamsError

R, R2, PLAIN = 1, 2, 3


class FakeManager:
    """Stock shape: add_transfer_request shards onto transfer_queues; transfer_worker drains a queue."""

    def __init__(self):
        self.transfer_queues = [queue.SimpleQueue(), queue.SimpleQueue()]
        self.transfer_infos = {R: {"relay:7001": 0}, R2: {"md:7002": 0}, PLAIN: {"d:7003": 0}}
        self.worked: list[tuple[str, int, str]] = []
        self.done = threading.Event()

    def add_transfer_request(self, room, payload):  # the stock body, reduced to its sharding
        self.transfer_queues[room % len(self.transfer_queues)].put((room, payload))

    def transfer_worker(self, q, executor, staging_buffer, worker_index):
        while True:
            room, payload = q.get()
            self.worked.append((threading.current_thread().name, room, PATH.get()))
            self.done.set()


class _Path(threading.local):
    value = "none"

    def get(self):
        return self.value


PATH = _Path()


@contextlib.contextmanager
def main_path():
    PATH.value = "main"
    yield


def test_main_chunks_go_down_a_lane_of_their_own_and_others_stay_on_the_stock_queues():
    reg = FanoutRegistry()
    reg.open(R, R2)
    relay_sessions = []
    lanes = MainLanes(reg, thread_context=main_path, on_relay_sessions=relay_sessions.extend)
    m = FakeManager()
    orig = FakeManager.add_transfer_request
    lanes.route(orig, m, R, "relay chunk")
    lanes.route(orig, m, R, "relay chunk 2")
    lanes.route(orig, m, PLAIN, "plain chunk")
    lanes.route(orig, m, R2, "main chunk")
    assert m.done.wait(10)
    stock = [m.transfer_queues[i].qsize() for i in range(2)]
    assert sum(stock) == 3  # relay and plain chunks, untouched
    assert lanes.lane_count() == 1
    assert m.worked == [("pdd-main-lane-0", R2, "main")]
    assert relay_sessions == ["relay:7001"]  # reported once


def test_a_closed_pair_is_routed_as_plain_pd():
    reg = FanoutRegistry()
    reg.open(R, R2)
    reg.close(R2)
    assert not reg.is_main(R2) and not reg.is_relay(R) and len(reg) == 0
    lanes = MainLanes(reg)
    m = FakeManager()
    lanes.route(FakeManager.add_transfer_request, m, R2, "x")
    assert lanes.lane_count() == 0 and m.transfer_queues[0].qsize() == 1


def req(custom_params, room=5):
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom_params), bootstrap_room=room)


def unsigned_builder():
    return FanoutBuilder(FanoutRegistry(), 30.0)


def test_main_room_is_read_from_custom_params():
    b = unsigned_builder()
    assert b.main_room(req({"pdd": {"v": 1, "main_room": 9}})) == 9
    assert b.main_room(req(None)) is None
    assert b.main_room(req({"pdd": {"v": 1}})) is None
    assert b.main_room(req({"other": 1})) is None


@pytest.mark.parametrize("params, words", [
    ({"pdd": {"v": 1, "main_room": "x"}}, "main_room"),
    ({"pdd": {"v": 2, "main_room": 9}}, "version"),
    ({"pdd": {"v": 1, "main_room": -1}}, "bootstrap room"),
    ({"pdd": {"v": 1, "main_room": 9, "bogus": 1}}, "bogus"),
    ({"pdd": {"v": 1, "main_room": 5}}, "differ"),
    ({"pdd": "main_room=9"}, "pdd"),
])
def test_malformed_pdd_params_are_a_clear_error(params, words):
    with pytest.raises(FanoutParamsError, match=words):
        unsigned_builder().main_room(req(params))


def signed(params: dict, room: int, secret: bytes = b"s3cret", **kw) -> dict:
    from sglang_pdd.protocol.request import parse
    from sglang_pdd.protocol.request_auth import ParamsSigner

    return parse(ParamsSigner(secret, **kw).sign(parse({"pdd": params}), room).to_custom_params())\
        .to_custom_params()


def test_a_prefill_with_the_secret_takes_only_the_routers_signed_main_room():
    from sglang_pdd.protocol.request_auth import ParamsVerifier

    b = FanoutBuilder(FanoutRegistry(), 30.0, verifier=ParamsVerifier(b"s3cret"))
    ok = signed({"v": 1, "main_room": 9}, room=5)
    assert b.main_room(req(ok, room=5)) == 9
    with pytest.raises(FanoutParamsError, match="already used"):  # the same body replayed
        b.main_room(req(ok, room=5))
    with pytest.raises(FanoutParamsError, match="not signed"):  # what a client could send
        b.main_room(req({"pdd": {"v": 1, "main_room": 9}}, room=5))
    with pytest.raises(FanoutParamsError, match="does not match"):  # signed for another request's room
        b.main_room(req(signed({"v": 1, "main_room": 9}, room=6), room=5))
    with pytest.raises(FanoutParamsError, match="does not match"):  # another secret
        b.main_room(req(signed({"v": 1, "main_room": 9}, room=5, secret=b"other"), room=5))
    assert b.main_room(req({"pdd": {"v": 1}}, room=5)) is None  # RLD's parameters name no room: nothing to sign
    # negative control: without the secret the same unsigned body is taken, as before
    assert unsigned_builder().main_room(req({"pdd": {"v": 1, "main_room": 9}}, room=5)) == 9


def test_the_mains_metadata_row_is_a_copy_that_names_the_mains_room():
    torch = pytest.importorskip("torch")
    from sglang_pdd.transfer.mooncake_fanout import MetadataRows

    bufs = SimpleNamespace(output_ids=torch.arange(64, dtype=torch.int32).reshape(4, 16),
                           output_hidden_states=torch.rand(4, 8),
                           bootstrap_room=torch.zeros((4, 8), dtype=torch.int64),
                           kv_checksum=torch.ones((4, 8), dtype=torch.int64), page_size=16)
    bufs.bootstrap_room[1, 0] = 77
    MetadataRows(allocator=None, buffers=bufs).copy_row(1, 3, room=2**62)
    assert torch.equal(bufs.output_ids[3], bufs.output_ids[1])
    assert torch.equal(bufs.output_hidden_states[3], bufs.output_hidden_states[1])
    assert bufs.bootstrap_room[3, 0].item() == 2**62 and bufs.bootstrap_room[1, 0].item() == 77
    assert bufs.kv_checksum[3].sum().item() == 0 and bufs.kv_checksum[1].sum().item() == 8


def test_closed_main_rooms_and_rejected_rooms_are_refused_boundedly():
    reg = FanoutRegistry(remember_closed=3)
    for room in (10, 11, 12):
        reg.open(room + 100, room)
        reg.close(room)
    reg.refuse(99)  # a rejected request's room
    assert not reg.refuses(10) and reg.refuses(11) and reg.refuses(12) and reg.refuses(99)
    reg.open(112, 12)  # a room in use again is not refused
    assert not reg.refuses(12)


def test_a_main_given_up_and_registering_before_release_is_told_it_failed():
    from sglang_pdd.transfer.mooncake_fanout import MooncakeRooms

    from tests.fakes.kv_manager import FakeKVManager

    kv, reg = FakeKVManager(), FanoutRegistry()
    reg.open(R, R2)
    rooms = MooncakeRooms(kv, reg)
    rooms.fail(R2, "bootstrap timeout")  # nobody registered yet: nobody to tell
    assert kv.status_messages == []
    kv.register(R2, "md:1", "10.0.0.9", 5000)  # the main decode shows up late
    rooms.release(R2)
    assert kv.status_messages == [([("10.0.0.9", 5000)], R2, 0)]
    assert R2 not in kv.failure_records and reg.refuses(R2)


def test_a_main_that_succeeded_gets_no_extra_message_on_release():
    from sglang_pdd.transfer.mooncake_fanout import MooncakeRooms

    from tests.fakes.kv_manager import FakeKVManager

    kv, reg = FakeKVManager(), FanoutRegistry()
    kv.register(R2, "md:1", "10.0.0.9", 5000)
    MooncakeRooms(kv, reg).release(R2)
    assert kv.status_messages == []


def test_a_refused_registration_is_told_it_failed_and_forgotten():
    from sglang_pdd.transfer.mooncake_fanout import refuse_room

    from tests.fakes.kv_manager import FakeKVManager

    kv = FakeKVManager()
    kv.register(R2, "md:1", "10.0.0.9", 5000, prefix=32)
    kv.request_status[R2] = 2  # registered before the prefill rejected the request
    refuse_room(kv, R2, "rejected")
    assert kv.status_messages == [([("10.0.0.9", 5000)], R2, 0)]
    assert R2 not in kv.transfer_infos and R2 not in kv.req_to_decode_prefix_len and R2 not in kv.request_status
    refuse_room(kv, R2, "rejected")  # nobody registered: nothing to tell
    assert len(kv.status_messages) == 1


@pytest.mark.parametrize("taken", ["open main leg", "open relay leg", "refused", "another request's room"])
def test_a_main_room_this_prefill_already_serves_is_refused(taken):
    reg = FanoutRegistry()
    reg.open(relay_room=100, main_room=200)
    reg.refuse(300)
    room = {"open main leg": 200, "open relay leg": 100, "refused": 300, "another request's room": 400}[taken]
    builder = FanoutBuilder(reg, main_bootstrap_timeout=1.0)
    with pytest.raises(FanoutParamsError, match=f"main_room {room} is a room this prefill already serves"):
        builder.check_room_free(room, rooms_in_flight={400, 401})
    builder.check_room_free(555, rooms_in_flight={400, 401})  # a fresh room is fine
