"""Contract of the CPU-time reader used for the servers' CPU seconds in the report."""

import os

from sglang_pdd.lab.bench import cpu


def test_stat_line_fields_are_utime_plus_stime_even_with_odd_process_names():
    line = "123 (my (odd) name) S 1 123 123 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 0 0"
    assert cpu.parse_stat_cpu(line) == 300.0


def test_own_cpu_time_grows_and_vanished_pids_count_zero():
    before = cpu.cpu_seconds([os.getpid()])
    x = 0
    for i in range(3_000_000):
        x += i * i
    after = cpu.cpu_seconds([os.getpid()])
    assert after > before
    assert cpu.cpu_seconds([2**22 + 12345]) == 0.0
    assert cpu.delta({"p": 3.0, "d": 1.0}, {"p": 1.0}) == {"p": 2.0, "d": 1.0}
