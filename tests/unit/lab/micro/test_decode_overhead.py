"""The decode-overhead benchmark's report (the run itself starts servers: python -m sglang_pdd.lab.micro.decode_overhead)."""

from sglang_pdd.lab.micro.decode_overhead import table
from sglang_pdd.lab.testing.launch_args import ServerConfig


def test_the_table_gives_each_servers_median_range_and_ratio_per_repeat():
    res = {"batch": 8, "tokens": 256, "prompt": 200, "repeat": 3,
           "tok_per_s": {"plain": [100.0, 110.0, 90.0], "main": [98.0, 99.0, 91.0]}}
    out = table(res)
    assert "| plain | 100.0 (90.0-110.0) | 1.000 / 1.000 / 1.000 |" in out
    assert "| main | 98.0 (91.0-99.0) | 0.980 / 0.900 / 1.011 |" in out


def test_overlap_rows_are_compared_with_plain_decode_on_the_same_loop():
    res = {"batch": 8, "tokens": 256, "prompt": 200, "repeat": 2,
           "tok_per_s": {"plain": [100.0, 100.0], "main": [99.0, 98.0],
                         "plain-overlap": [120.0, 110.0], "main-overlap": [114.0, 110.0]}}
    out = table(res)
    assert "| main-overlap | 112.0 (110.0-114.0) | 0.950 / 1.000 |" in out
    assert "| plain-overlap | 115.0 (110.0-120.0) | 1.000 / 1.000 |" in out


def test_an_overlap_server_drops_only_the_non_overlap_flag():
    argv = ServerConfig(model="m", port=1, overlap=True).argv()
    assert "--disable-overlap-schedule" not in argv and "--sleep-on-idle" in argv
    assert "--disable-overlap-schedule" in ServerConfig(model="m", port=1).argv()
