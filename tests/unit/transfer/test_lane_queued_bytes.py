"""A main lane counts the KV bytes it holds and reports them per destination (the router's queue-aware
WAN prediction reads the gauge)."""

import threading
from types import SimpleNamespace

from sglang_pdd.transfer.lanes import CountingQueue, FanoutRegistry, MainLanes, chunk_bytes

PAGE = 1000  # bytes of one page over every KV buffer


def chunk(pages: int):
    return SimpleNamespace(prefill_kv_indices=list(range(pages)))


def test_a_chunk_counts_from_its_put_until_the_worker_asks_for_the_next():
    seen = []
    q = CountingQueue(lambda c: len(c.prefill_kv_indices) * PAGE, seen.append)
    a, b = chunk(3), chunk(2)
    q.put(a)
    q.put(b)
    assert q.queued_bytes == 5 * PAGE
    assert q.get() is a
    assert q.queued_bytes == 5 * PAGE  # a is being written
    assert q.get() is b  # a is written
    assert q.queued_bytes == 2 * PAGE
    q.put(None)  # the teardown sentinel holds nothing
    assert q.get() is None
    assert q.queued_bytes == 0
    assert seen == [3 * PAGE, 5 * PAGE, 2 * PAGE, 0]


def test_a_chunk_put_back_while_written_counts_once_and_stays_until_written():
    q = CountingQueue(lambda c: len(c.prefill_kv_indices) * PAGE)
    a = chunk(4)
    q.put(a)
    assert q.get() is a
    q.put(a)  # deferred: back in the queue
    assert q.queued_bytes == 4 * PAGE
    assert q.get() is a
    assert q.queued_bytes == 4 * PAGE
    q.put(chunk(1))
    q.get()
    assert q.queued_bytes == 1 * PAGE


def test_an_idle_worker_does_not_hold_the_last_chunk():
    """The worker blocks on an empty queue after its last chunk: that chunk is written, not queued."""
    q = CountingQueue(lambda c: len(c.prefill_kv_indices) * PAGE)
    q.put(chunk(2))
    q.get()
    t = threading.Thread(target=q.get, daemon=True)
    t.start()
    t.join(0.2)  # blocked on the empty queue
    assert q.queued_bytes == 0
    q.put(None)
    t.join()


class Manager:
    kv_args = SimpleNamespace(kv_item_lens=[400, 600])

    def __init__(self):
        self.transfer_infos = {7: {"md:7002": 0, "md:7003": 0}}
        self.transfer_queues = []
        self.release = threading.Event()

    def add_transfer_request(self, room, c):
        self.transfer_queues[0].put(c)

    def transfer_worker(self, q, executor, staging_buffer, worker_index):
        while True:
            c = q.get()
            if c is None:
                return
            self.release.wait()


def test_main_lane_reports_its_queued_bytes_by_its_first_receiver_session():
    reg = FanoutRegistry()
    reg.open(6, 7)
    reports = []
    lanes = MainLanes(reg, on_queued=lambda peer, n: reports.append((peer, n)))
    m = Manager()
    assert chunk_bytes(m, chunk(3)) == 3 * PAGE
    lanes.route(Manager.add_transfer_request, m, 7, chunk(3))
    lanes.route(Manager.add_transfer_request, m, 7, chunk(5))
    assert reports[:2] == [("md:7002", 3 * PAGE), ("md:7002", 8 * PAGE)]
    m.release.set()
    lanes.route(Manager.add_transfer_request, m, 7, None)  # ends the lane's worker
