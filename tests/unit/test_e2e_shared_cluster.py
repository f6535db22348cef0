"""tests/e2e/shared_cluster.py's logic above the servers: which order the collection runs the modules of
one shared cluster in, when the live cluster is handed on, cleared, started afresh or stopped. The
servers are real in the e2e modules that use it; here a recipe records its calls."""

from __future__ import annotations

import pytest

from tests.e2e import shared_cluster
from tests.e2e.shared_cluster import SharedClusters, group_by_cluster


class Item:
    def __init__(self, name: str, key: str | None):
        self.name, self.key = name, key

    def get_closest_marker(self, name: str):
        assert name == shared_cluster.MARK
        return pytest.mark.shared_cluster(self.key).mark if self.key else None


def names(items):
    return [i.name for i in items]


def test_the_modules_of_one_key_run_together_the_rest_in_their_order():
    items = [Item("a1", "A"), Item("x", None), Item("b1", "B"), Item("a2", "A"), Item("y", None),
             Item("b2", "B"), Item("a3", "A")]
    group_by_cluster(items)
    assert names(items) == ["a1", "a2", "a3", "x", "b1", "b2", "y"]


class FakeServer:
    def __init__(self):
        self.up = True

    def alive(self):
        return self.up


class FakeCluster(dict):
    def __init__(self, calls):
        super().__init__(server=FakeServer())
        self.calls = calls

    def clear_knobs(self):
        self.calls.append(("clear",))


@pytest.fixture
def recipes(monkeypatch, tmp_path):
    calls = []

    def start(group, model):
        calls.append(("start", model))
        cluster = FakeCluster(calls)
        group.servers.append(cluster["server"])
        return cluster

    monkeypatch.setattr(shared_cluster.ServerGroup, "stop", lambda self: calls.append(("stop", len(self.servers))))
    monkeypatch.setitem(shared_cluster.RECIPES, "A", start)
    monkeypatch.setitem(shared_cluster.RECIPES, "B", start)
    return calls, SharedClusters(str(tmp_path))


def test_one_start_per_key_cleared_for_each_new_owner_and_stopped_after_its_last_test(recipes):
    calls, shared = recipes
    first = shared.get("A", "m", owner="mod1")
    assert shared.get("A", "m", owner="mod1") is first  # a second fixture of the same module: nothing cleared
    assert shared.get("A", "m", owner="mod2") is first
    assert calls == [("start", "m"), ("clear",)]
    shared.close_after(Item("next of A", "A"))
    assert shared.key == "A"
    shared.close_after(Item("unshared", None))
    assert shared.key is None and calls[-1] == ("stop", 1)


def test_another_key_or_a_dead_server_means_a_fresh_cluster(recipes):
    calls, shared = recipes
    a = shared.get("A", "m", owner="mod1")
    b = shared.get("B", "m", owner="mod2")
    assert b is not a and calls == [("start", "m"), ("stop", 1), ("start", "m")]
    b["server"].up = False
    again = shared.get("B", "m", owner="mod3")
    assert again is not b and calls[-2:] == [("stop", 1), ("start", "m")]
    assert shared.starts == {"A": 1, "B": 2}
    shared.close_after(None)  # the session's last test
    assert shared.key is None
