"""Migration after a stall (issue 18): a silent MD may be a WAN cut, so its request goes on past the
MDs behind the same cut (an MD at another site, else RLD next to P). Over the router's HTTP front with
the fake roles of tests/unit/router/kit/fixed_model.py."""

import json

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from tests.unit.router.kit.fixed_model import (PROMPT, generate_body, migrations_by_cause, model, post_generate,
                                               reference, run)


def test_a_silent_md_migrates_after_its_idle_deadline_to_an_md_at_another_site():
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main", site="B2")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=4, how="hang"), model()
            return await post_generate(cl, generate_body(8), idle_s=0.5), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200 and json.loads(text)["output_ids"] == reference(8)
    assert migrations_by_cause(metrics) == {("idle", "completed"): 1}
    assert cl.main.aborts and len(cl.main2.bodies) == 1 and not cl.relay.bodies


def test_a_silent_md_migrates_past_the_mds_of_its_own_site():
    """MD 1 goes silent; MD 2 shares its site (behind the same WAN), MD 3 is elsewhere and busier: MD 3
    gets it all the same (the pick by load alone took MD 2)."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main"), main3=fu.FakeRole("main", site="B2", running=5)) as cl:
            cl.main.behaviour, cl.main2.behaviour, cl.main3.behaviour = model(fail_at=4, how="hang"), model(), model()
            return await post_generate(cl, generate_body(8), idle_s=0.5), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200 and json.loads(text)["output_ids"] == reference(8)
    assert len(cl.main3.bodies) == 1 and not cl.main2.bodies and not cl.relay.bodies


@pytest.mark.parametrize("how", ["hang", "end"])
def test_a_silent_md_with_only_md_at_its_site_left_goes_on_on_rld(how):
    """A WAN cut looks like a silent MD, and the other MD at its site is behind the same cut: the rest
    goes P->RLD (next to P). The negative control: an MD that died (its stream ended) goes on on the
    other MD, as before."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=4, how=how), model()
            cl.relay.behaviour = model()
            return await post_generate(cl, generate_body(8), idle_s=0.5), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200 and json.loads(text)["output_ids"] == reference(8)
    if how == "hang":
        assert migrations_by_cause(metrics) == {("idle", "completed"): 1}
        assert len(cl.relay.bodies) == 1 and not cl.main2.bodies
        assert cl.relay.bodies[0]["input_ids"] == PROMPT + reference(4)
    else:
        assert migrations_by_cause(metrics) == {("broken", "completed"): 1}
        assert len(cl.main2.bodies) == 1 and not cl.relay.bodies
