"""TP > 1 on the decode roles: rank 0's decisions reach the other ranks (a real gloo group of two
processes), and the followers apply them to their own requests or stop on a disagreement."""

from __future__ import annotations

import multiprocessing as mp
import socket
from types import SimpleNamespace

import pytest

from sglang_pdd.decode.rank_sync import Abort, Finish, Hold, RankSync, Refuse, Round

pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = SimpleNamespace(rank=rank, ranks=[0, 1], cpu_group=dist.group.WORLD)
        sync = RankSync(SimpleNamespace(tp_group=group, tp_size=2))
        sent = Round(ops=[Hold("a"), Finish("b", 3, "one-shot")], busy=True) if sync.leader else None
        first = sync.exchange(sent)
        empty = sync.exchange(Round() if sync.leader else None)
        out.put((rank, sync.leader, first.ops, first.busy, empty.ops))
    finally:
        dist.destroy_process_group()


def test_rank_0_round_reaches_rank_1_over_gloo():
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict((r[0], r[1:]) for r in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)
    want_ops = [Hold("a"), Finish("b", 3, "one-shot")]
    assert got[0] == (True, want_ops, True, [])
    assert got[1] == (False, want_ops, True, [])


def test_tp1_exchanges_nothing():
    sync = RankSync(SimpleNamespace(tp_size=1, tp_group=None))
    assert not sync.active and sync.leader
    r = Round(ops=[Hold("a")])
    assert sync.exchange(r) is r


class Sync:
    """Rank 0's rounds, as a follower receives them."""

    def __init__(self, *rounds):
        self.rounds = list(rounds)

    def exchange(self, sent=None):
        assert sent is None
        return self.rounds.pop(0)


def req(rid):
    return SimpleNamespace(rid=rid)


def test_main_follower_holds_and_ends_what_rank_0_did(monkeypatch):
    from sglang_pdd.decode.main import follower as mod

    ended = []
    monkeypatch.setattr(mod, "end_request", lambda s, r, held, msg, rf, keep: ended.append((r.rid, held, msg)))
    monkeypatch.setattr(mod, "end_queued", lambda r, msg, code: ended.append((r.rid, "refused", code)))
    a, b, c = req("a"), req("b"), req("c")
    s = SimpleNamespace(waiting_queue=[a, b, c])
    f = mod.MainFollower(s, Sync(Round([Refuse("c", "no", 400)]),
                                 Round([Hold("a"), Hold("b")], busy=True),
                                 Round([Abort("a", True, "gone", False), Abort("z", False, "queued", False)])),
                         attention=SimpleNamespace(disarm=lambda *a: None))
    f.admit(c)
    f.poll()
    assert s.waiting_queue == [c] and set(f.held) == {"a", "b"} and f.busy()
    f.poll()
    assert set(f.held) == {"b"}
    assert ended == [("c", "refused", 400), ("a", True, "gone"), ("z", False, "queued")]


def test_main_follower_stops_when_the_ranks_disagree():
    from sglang_pdd.decode.main.follower import MainFollower

    f = MainFollower(SimpleNamespace(waiting_queue=[]), Sync(Round([Hold("a")]), Round([Refuse("x", "no", 400)])),
                     attention=SimpleNamespace(disarm=lambda *a: None))
    with pytest.raises(RuntimeError, match="TP ranks disagree: request a is not in this rank's waiting queue"):
        f.poll()
    with pytest.raises(RuntimeError, match="TP ranks disagree: admitting y"):
        f.admit(req("y"))


def test_relay_follower_finishes_the_request_rank_0_handed_over(monkeypatch):
    from sglang_pdd.decode.relay import follower as mod

    done = []
    monkeypatch.setattr(mod, "end_with_handoff", lambda s, r, k, mode: done.append((r.rid, k, mode)))
    s = SimpleNamespace(running_batch=SimpleNamespace(reqs=[req("a")]), waiting_queue=[req("b")])
    f = mod.RelayFollower(s, Sync(Round([Finish("b", 1, "one-shot"), Finish("a", 7, "catch-up")]),
                                  Round([Finish("c", 2, "one-shot")])))
    f.poll()
    assert done == [("b", 1, "one-shot"), ("a", 7, "catch-up")]
    with pytest.raises(RuntimeError, match="request c is not decoding here"):
        f.poll()


def test_rank_0_records_ops_for_the_next_poll_round_and_tp1_keeps_none():
    sync = RankSync(SimpleNamespace(tp_size=1, tp_group=None))
    sync.record(Hold("a"))
    sync.flush(busy=True)
    assert sync.pending == []
    group = SimpleNamespace(rank=0, ranks=[0, 1], cpu_group=None)
    sync = RankSync(SimpleNamespace(tp_size=2, tp_group=group))
    sent = []
    sync.exchange = lambda r=None: sent.append(r) or r
    sync.record(Hold("a"))
    sync.record(Abort("b", True, "gone", False))
    sync.flush(busy=True)
    sync.flush()
    assert [(r.ops, r.busy) for r in sent] == [([Hold("a"), Abort("b", True, "gone", False)], True), ([], False)]
    assert sync.pending == []
