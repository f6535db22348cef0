"""--repeat's reduction (bench/repeats.py), per-thread CPU windows (bench/cpu.py), placement, thread names."""

import math
import os
import threading

import pytest

from sglang_pdd.server import thread_names
from sglang_pdd.lab.bench import cpu, placement, repeats
from sglang_pdd.lab.bench.metrics import RequestRecord


def _figs(ttft):
    return {f: float("nan") for f in repeats.FIGURES} | {"TTFT P50 (s)": ttft}


def test_medians_spread_and_ratios_are_per_repeat_against_the_same_repeats_baseline():
    agg = repeats.aggregate({"base": [_figs(2.0), _figs(4.0), _figs(3.0)],
                             "pdd": [_figs(1.0), _figs(1.0), None]}, "base")
    b, p = agg["base"]["TTFT P50 (s)"], agg["pdd"]["TTFT P50 (s)"]
    assert (b["median"], b["min"], b["max"]) == (3.0, 2.0, 4.0)
    assert (p["median"], p["min"], p["max"]) == (1.0, 1.0, 1.0)  # the failed repeat is left out
    assert p["ratios"][:2] == [0.5, 0.25] and math.isnan(p["ratios"][2])
    md = "\n".join(repeats.markdown(agg, "base", 3))
    assert "1.00 (1.00-1.00)<br>x 0.50 / 0.25 / n/a" in md


def test_a_verdict_is_stable_only_when_every_repeat_agrees():
    def figs(ttft, goodput):
        return _figs(ttft) | {"goodput (share)": goodput}
    agg = repeats.aggregate({"base": [figs(2.0, 0.5), figs(2.0, 0.5), figs(2.0, 0.5)],
                             "a": [figs(1.0, 0.9), figs(1.5, 0.6), figs(1.9, 0.7)],
                             "b": [figs(1.0, 0.4), figs(2.5, 0.5), figs(1.0, 0.9)]}, "base")
    v = repeats.verdicts(agg, "base")
    assert v["a"]["TTFT P50 (s)"] == (3, 3) and v["a"]["goodput (share)"] == (3, 3)  # lower TTFT, higher goodput
    assert v["b"]["TTFT P50 (s)"] == (2, 3) and v["b"]["goodput (share)"] == (1, 3)  # a tie is not better
    assert "base" not in v and "TTFT P99 (s)" not in v["a"] or v["a"]["TTFT P99 (s)"] == (0, 0)
    md = "\n".join(repeats.markdown(agg, "base", 3))
    assert "`a` against `base`, repeat by repeat: TTFT P50 (s) better in 3/3 (stable)" in md
    assert "TTFT P50 (s) better in 2/3 (flips)" in md


def _rec(rid, ttft, pipeline=""):
    return RequestRecord(request_id=rid, session_id=0, turn=0, input_len=10, hit_rate=0.0, sent_s=0.0, ok=True,
                         ttft_s=ttft, e2e_s=ttft + 1.0, tpot_s=0.1, pipeline=pipeline)


def test_relayed_figures_are_over_the_requests_rld_served_or_all_for_a_system_without_rld():
    recs = [_rec("a", 1.0, "P->RLD->MD"), _rec("b", 9.0, "P->MD"), _rec("c", 3.0, "P->RLD")]
    assert [r.request_id for r in repeats.relayed(recs)] == ["a", "c"]
    assert [r.request_id for r in repeats.relayed([_rec("x", 1.0), _rec("y", 2.0)])] == ["x", "y"]


def test_a_cpu_window_names_the_busiest_threads_and_counts_the_rest():
    k = lambda tid, name: cpu.ThreadKey(1, tid, name)  # noqa: E731
    before = cpu.Snapshot({"p": 10.0}, {"p": {k(1, "sched/main"): 5.0, k(2, "sched/transfer_worker"): 1.0,
                                              k(3, "sched/transfer_worker"): 1.0}})
    after = cpu.Snapshot({"p": 20.0}, {"p": {k(1, "sched/main"): 9.0, k(2, "sched/transfer_worker"): 3.0,
                                             k(3, "sched/transfer_worker"): 2.0, k(4, "sched/new"): 0.5}})
    w = cpu.window(after, before, top=2)["p"]
    assert w["cpu_s"] == 10.0
    assert w["threads"] == {"sched/main": 4.0, "sched/transfer_worker": 3.0, "other": 3.0}  # 0.5 + 2.5 exited


def test_this_process_threads_are_read_from_proc_with_their_kernel_names():
    assert thread_names.install({thread_names.ENV: "1"})
    seen = {}
    done = threading.Event()

    def busy_worker():
        x = 0
        for i in range(200_000):
            x += i
        seen.update(cpu.thread_seconds([os.getpid()]))
        done.set()

    t = threading.Thread(target=busy_worker)
    t.start()
    t.join()
    names = {key.name.split("/", 1)[1] for key in seen}
    assert "main" in names and "busy_worker" in names


def test_kernel_names_prefer_the_target_of_a_default_named_thread_and_fit_15_bytes():
    assert thread_names.kernel_name("Thread-3 (transfer_worker)") == "transfer_worker"
    assert thread_names.kernel_name("Thread-12") == "Thread-12"
    assert thread_names.kernel_name("a-very-long-thread-name") == "a-very-long-thr"


def test_per_dc_placement_splits_the_cpus_and_shared_pins_nothing():
    assert placement.cpu_sets("shared", [0, 1]) == {}
    assert placement.cpu_sets("per-dc", [0, 1]) == {"A": "0", "B": "1"}
    assert placement.cpu_sets("per-dc", [0, 1, 2, 3, 4]) == {"A": "0,1", "B": "2,3,4"}
    with pytest.raises(ValueError):
        placement.cpu_sets("per-dc", [0])
    d = placement.describe("per-dc", [0, 1])
    assert d["cpu_sets"] == {"A": "0", "B": "1"} and "delay daemons" in d["unpinned"]


def test_the_placement_records_the_thread_counts_and_refuses_zero_threads_in_an_env():
    from sglang_pdd.lab.bench.report import _placement_text

    d = placement.describe("shared", [0, 1], threads={"prefill": 0, "decode": 1})
    assert d["threads"] == {"decode": 1, "prefill": "default"}
    assert "decode 1" in _placement_text(d) and "prefill" not in _placement_text(d).split("torch threads")[1]
    assert "torch's default" in _placement_text(placement.describe("shared", [0, 1]))
    assert placement.thread_env(1) == {"OMP_NUM_THREADS": "1"}
    with pytest.raises(ValueError):
        placement.thread_env(0)
