"""Two scenarios of the fault-injection suite (`python -m sglang_pdd.lab.faults`) on real sglang,
real Mooncake and the netns WAN testbed, through the suite's own harness: MD SIGKILLed past a
handoff, and the WAN cut for 5 s while MD's KV is on it. No request may hang or come back silently
wrong, nothing may leak, and every request completes token-identical (a surviving server can absorb
both faults). The negative control of the classifier is in tests/unit/lab/faults/test_report.py."""


import pytest

from sglang_pdd.lab.faults.suite import Options, run
from sglang_pdd.lab.faults.report import details, table
from sglang_pdd.lab.faults.scenarios import parse
from sglang_pdd.lab.testbed.pytest_plugin import unique_prefix, why_no_testbed

pytestmark = pytest.mark.e2e


def test_md_kill_and_a_short_wan_cut_cost_no_request(tiny_model, artifacts_dir, figures):
    reason = why_no_testbed()
    if reason:
        pytest.skip(reason)
    reports, _ = run(parse("wan-cut-5s,md-kill-after-handoff"), Options(concurrency=3, turns=2),
                     artifacts_dir, unique_prefix("pf"))
    text = table(reports) + "\n" + details(reports)
    for r in reports:
        assert r.ok, text
        c = r.counts
        assert c["hung"] == c["wrong"] == c["failed"] == 0 and not r.leaked, text
        assert c["identical"] + c["migrated"] == r.requests >= 3, text
    kill = reports[1]  # last: the killed MD needs no restart for a later scenario
    assert kill.counts["migrated"] >= 1, text  # the kill landed on a request past its handoff
    assert sum(v for k, v in kill.migrations.items() if k.endswith("/completed")) >= 1, text
    figures.append(f"fault suite: {kill.name} {kill.counts}, migrated gap {kill.gap_s.get('migrated')}; "
                   f"{reports[0].name} {reports[0].counts}")
