"""bench.runner with a fake system and testbed: the repeats interleave, each run gets its label,
log directory, the shared server flags and CPU sets, and the CPU window of its processes."""

import os
from dataclasses import replace

from sglang_pdd.bench import runner, systems
from sglang_pdd.bench.client import StreamResult
from sglang_pdd.bench.presets import get_preset


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
