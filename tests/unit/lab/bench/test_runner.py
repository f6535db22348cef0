"""bench.runner with a fake system and testbed: the repeats interleave, each run gets its label,
log directory, the shared server flags and CPU sets, and the CPU window of its processes."""

import os
from dataclasses import replace

from sglang_pdd.lab.bench import runner, systems
from sglang_pdd.lab.bench.client import StreamResult
from sglang_pdd.lab.bench.presets import get_preset


class FakeNS:
    def call(self, fn, *a, **kw):
        return fn(*a, **kw)


class FakeTestbed:
    def ns(self, side):
        return FakeNS()

    def link_bytes(self):
        return {"A->B": 0, "B->A": 0}

    def daemon_pids(self):
        return {"B": os.getpid()}


class FakeServer:
    name = "prefill"

    def group_pids(self):
        return [os.getpid()]


STARTED = []


class FakeSystem(systems.System):
    name = "fake-runner-test"
    sim_name = "same-dc-pd"

    def start(self, dep):
        STARTED.append((dep.log_dir, dep.server_flags, dep.cpus))

    def stop(self):
        pass

    @property
    def url(self):
        return "http://fake"

    def send(self, body, timeout_s):
        n = body["sampling_params"]["max_new_tokens"]
        return StreamResult(ok=True, ttft_s=0.01, e2e_s=0.01 + 0.001 * (n - 1), prompt_tokens=len(body["input_ids"]),
                            output_tokens=n, output_ids=list(range(n)))

    def servers(self):
        return [FakeServer()]


def test_repeats_interleave_and_each_run_carries_its_label_flags_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setitem(systems._REGISTRY, FakeSystem.name, FakeSystem)
    preset = get_preset("cold")
    reqs = [replace(r, arrival_s=0.0, think_s=0.0) for r in preset.requests()]
    STARTED.clear()
    runs = []
    for r in range(2):
        runs.append(runner.run_system(FakeSystem.name, FakeTestbed(), "model", reqs, preset,
                                      preset.workload.vocab_size, str(tmp_path), False, None, r, 2,
                                      ("--pdd-idle-wait-ms", "5"), {"A": "0"}))
    assert [x.error for x in runs] == ["", ""]
    assert [x.label for x in runs] == [f"{FakeSystem.name}-r1", f"{FakeSystem.name}-r2"]
    assert [s[0] for s in STARTED] == [str(tmp_path / x.label) for x in runs]
    assert STARTED[0][1:] == (("--pdd-idle-wait-ms", "5"), {"A": "0"})
    assert runs[0].summary.system == runs[0].label and runs[0].summary.failed == 0
    assert {"prefill", "delay daemon B", "bench (client)"} <= set(runs[0].cpu)
    assert all(g["cpu_s"] >= 0 for g in runs[0].cpu.values())


class CountingTestbed(FakeTestbed):
    """Link counters that grow by 1000 bytes A->B per read (900 of them the background flow's)."""

    def __init__(self):
        self.reads = 0

    def link_bytes(self):
        self.reads += 1
        return {"A->B": 1000 * self.reads, "B->A": 10 * self.reads}


class FakeFlow:
    made = []

    def __init__(self, tb, src, dst, port, pace_mbit):
        self.tb, self.args, self.stopped = tb, (src, dst, port, pace_mbit), False
        FakeFlow.made.append(self)

    def start(self):
        return self

    def describe(self):
        return {"direction": "A->B", "kind": "unpaced TCP"}

    def pids(self):
        return [os.getpid()]

    def wire_bytes(self):
        return {"A->B": 900 * self.tb.reads, "B->A": 9 * self.tb.reads}

    def stop(self):
        self.stopped = True


def test_a_background_flow_runs_over_the_window_and_its_bytes_are_not_the_systems(monkeypatch, tmp_path):
    monkeypatch.setitem(systems._REGISTRY, FakeSystem.name, FakeSystem)
    monkeypatch.setattr(runner, "BulkFlow", FakeFlow)
    FakeFlow.made.clear()
    preset = get_preset("congested")
    reqs = [replace(r, arrival_s=0.0, think_s=0.0) for r in preset.requests()][:6]
    tb = CountingTestbed()
    run = runner.run_system(FakeSystem.name, tb, "model", reqs, preset, preset.workload.vocab_size, str(tmp_path),
                            False)
    assert run.error == ""
    (flow,) = FakeFlow.made
    assert flow.args == ("A", "B", 45000, None) and flow.stopped
    # two link reads (1000 and 2000 A->B), the flow's 900 of each read left out: the system's 100
    assert (run.wan.a_to_b, run.wan.b_to_a) == (100, 1)
    assert run.background["wire_bytes"] == {"A->B": 900, "B->A": 9} and "background flow" in run.cpu
    # a preset without a background starts no flow
    FakeFlow.made.clear()
    cold = get_preset("cold")
    runner.run_system(FakeSystem.name, FakeTestbed(), "model", [replace(r, arrival_s=0.0, think_s=0.0)
                                                                for r in cold.requests()], cold,
                      cold.workload.vocab_size, str(tmp_path / "c"), False)
    assert FakeFlow.made == []
