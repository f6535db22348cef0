"""MainDecode's catch-up chunks under sglang's overlap scheduler: a chunk's result arrives one
iteration late, with `batch.copy()` (a new ScheduleBatch over a copy of the request list), possibly
after the next chunk batch of other requests was launched. Each result must reach the chunk it
belongs to; any other batch's result is sglang's."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_pdd.decode.main.handoff_attention import HandoffAttention
from sglang_pdd.decode.main.runtime import MainRuntime


class Batch:
    def __init__(self, reqs):
        self.reqs = list(reqs)

    def copy(self):  # what sglang's overlap loop queues with the result
        return Batch(self.reqs[:])


class Handoff:
    def __init__(self):
        self.done, self.pending = [], {}

    def chunk_done(self, p, md_batch):
        self.done.append((p.name, md_batch))


def req(name):
    return SimpleNamespace(name=name, finished=lambda: False)


def runtime():
    rt = MainRuntime.__new__(MainRuntime)
    rt._chunks, rt.handoff, rt.last_extend = {}, Handoff(), None
    rt.attention = HandoffAttention(record=lambda *a: None)
    rt.scheduler = SimpleNamespace(running_batch=SimpleNamespace(reqs=[1, 2, 3]))
    return rt


def launch(rt, names):
    """What `_select` does for a catch-up chunk: remember its items by the batch's requests."""
    from sglang_pdd.decode.main.runtime import chunk_key

    items = [SimpleNamespace(name=n, req=req(n)) for n in names]
    batch = Batch([p.req for p in items])
    rt._chunks[chunk_key(batch)] = items
    return batch


def test_a_chunks_result_for_a_copy_of_its_batch_is_taken_one_iteration_late():
    rt = runtime()
    first = launch(rt, ["a", "b"])
    second = launch(rt, ["c"])  # launched before the first's result is processed
    assert rt.busy()
    assert rt.on_batch_result(first.copy(), object())
    assert rt.handoff.done == [("a", 3), ("b", 3)]
    assert rt.on_batch_result(second.copy(), object())
    assert rt.handoff.done[-1] == ("c", 3) and rt._chunks == {}


def test_other_batches_results_are_sglangs():
    rt = runtime()
    chunk = launch(rt, ["a"])
    decode = Batch([chunk.reqs[0], req("x")])  # a batch sharing a request is still not the chunk
    assert not rt.on_batch_result(decode, object())
    assert not rt.on_batch_result(Batch([]), object())
    assert not rt.on_batch_result(None, object())
    assert rt.handoff.done == [] and len(rt._chunks) == 1
