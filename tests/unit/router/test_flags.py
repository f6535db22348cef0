"""The router's command line (issue 35 item 7): every flag has help and `--help` shows its default (or
that it is required) once; sglang-router's names are the main ones where the meaning is the same, and the
old names still parse to the same destination."""

from __future__ import annotations

import argparse
import re

import pytest

from sglang_pdd.router.__main__ import build_parser
from sglang_pdd.router.flags import _shown

BASE = ["--prefill", "http://p:1", "--main", "http://m:3"]


def _blocks(help_text: str) -> dict[str, str]:
    """Each option's block of the formatted help (its first option string -> its text, one line)."""
    blocks, name = {}, None
    for line in help_text.split("options:", 1)[1].splitlines():
        if re.match(r"^  -", line):
            name = line.split()[0].rstrip(",")
            blocks[name] = line
        elif name is not None:
            blocks[name] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in blocks.items()}


def test_every_flag_has_help_and_its_default_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside a default
    ap = build_parser()
    blocks = _blocks(ap.format_help())
    actions = [a for a in ap._actions if a.default is not argparse.SUPPRESS]  # all but --help
    assert len(actions) > 40
    for a in actions:
        block = blocks[a.option_strings[0]]
        assert a.help and a.help.strip(), a.option_strings
        if a.required:
            assert block.endswith("(required)") and "(default" not in block, block
            continue
        assert block.count("(default") == 1, block  # shown, and never twice
        if a.default not in (None, []):
            assert f"(default: {_shown(a.default)})" in block or f"(default {_shown(a.default)}:" in block, block


def test_the_formatter_adds_the_default_a_help_does_not_state():
    ap = argparse.ArgumentParser(formatter_class=build_parser().formatter_class)
    ap.add_argument("--a", type=float, default=2.0, help="a")
    ap.add_argument("--b", type=int, default=3, help="b (default 3: why)")
    ap.add_argument("--c", default="5%", help="c")
    text = " ".join(ap.format_help().split())
    assert "a (default: 2)" in text and "b (default 3: why)" in text and "(default: 3)" not in text
    assert "c (default: 5%)" in text


@pytest.mark.parametrize("new, old, dest, value", [
    (["--tokenizer-path", "x"], ["--tokenizer", "x"], "tokenizer_path", "x"),
    (["--policy", "round_robin"], ["--peer-policy", "round-robin"], "peer_policy", "round-robin"),
    (["--request-timeout-secs", "5"], ["--request-timeout", "5"], "request_timeout", 5.0),
    (["--health-check-interval-secs", "1"], ["--health-check-s", "1"], "health_check_s", 1.0),
    (["--log-level", "WARNING"], ["--log-level", "warning"], "log_level", "warning"),
])
def test_sglang_router_names_and_the_old_ones_parse_alike(new, old, dest, value):
    tok = [] if dest == "tokenizer_path" else ["--tokenizer-path", "x"]
    a, b = (vars(build_parser().parse_args(BASE + tok + argv)) for argv in (new, old))
    assert a == b and a[dest] == value


def test_a_policy_sglang_router_has_and_the_router_not_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(BASE + ["--tokenizer-path", "x", "--policy", "power_of_two"])
    assert "--policy" in capsys.readouterr().err


def test_the_ttft_slo_flag_parses_and_refuses_a_negative_value(capsys):
    base = ["--prefill", "http://p:1", "--main", "http://m:3", "--tokenizer-path", "x"]
    assert build_parser().parse_args(base).ttft_slo_secs == 0.0
    assert build_parser().parse_args(base + ["--ttft-slo-secs", "2"]).ttft_slo_secs == 2.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--ttft-slo-secs", "-1"])
    assert "--ttft-slo-secs" in capsys.readouterr().err


@pytest.mark.parametrize("flags,named", [
    (["--relay-pool-min", "3", "--relay-pool-max", "1"], "--relay-pool-min"),
    (["--relay-pool-instance-price", "0"], "--relay-pool-instance-price"),
    (["--relay-slots", "0"], "--relay-slots"),
    (["--relay-pool-window-secs", "0"], "--relay-pool-window-secs"),
])
def test_the_relay_pool_flags_refuse_what_cannot_work_and_name_the_flag(flags, named):
    from sglang_pdd.router.__main__ import _relay_pool_scale

    base = BASE + ["--relay", "http://r:1", "--tokenizer-path", "x", "--ttft-slo-secs", "2"]
    good = build_parser().parse_args(base)
    cfg = _relay_pool_scale(good, relays=1)
    assert (cfg.min_instances, cfg.max_instances, cfg.instance_price, cfg.base_price) == (0, 1, 8.0, 72.0)
    assert _relay_pool_scale(build_parser().parse_args(BASE + ["--tokenizer-path", "x"]), relays=1) is None  # no SLA
    with pytest.raises(ValueError, match=named):
        _relay_pool_scale(build_parser().parse_args(base + flags), relays=1)
