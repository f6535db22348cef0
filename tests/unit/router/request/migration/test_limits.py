"""Migrations are spread and rate-limited (issue 31): a random jitter before each, a token bucket over
all (`router.request.migration.limits`); over the limit a request fails with its own 503 instead of
migrating. Seeded random source, fake clock and recorded sleeps: no wall-clock."""

import json
import random

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.request.migration.limits import MigrationLimits
from tests.unit.router.kit.dispatch_client import config, router
from tests.unit.router.kit.fixed_model import generate_body, migrations_by_cause, model, reference, run


def test_the_bucket_holds_burst_and_refills_at_its_rate():
    t = [0.0]
    lim = MigrationLimits(rate_per_s=2.0, burst=3, jitter_s=0, now=lambda: t[0])
    assert [lim.take() for _ in range(4)] == [True, True, True, False]
    t[0] = 0.5  # one token back
    assert lim.take() and not lim.take()
    t[0] = 100.0  # full again, not beyond the burst
    assert [lim.take() for _ in range(4)] == [True, True, True, False]
    assert all(MigrationLimits(rate_per_s=0, burst=1, now=lambda: 0.0).take() for _ in range(100))  # no limit


def test_bad_settings_are_refused_naming_the_flag():
    for kw in ({"rate_per_s": -1}, {"burst": 0}, {"jitter_s": -0.1}):
        with pytest.raises(ValueError, match="--migration-"):
            MigrationLimits(**kw)


def test_the_jitter_is_drawn_from_the_random_source():
    slept = []

    async def sleep(s):
        slept.append(s)

    lim = MigrationLimits(jitter_s=0.25, rng=random.Random(7), sleep=sleep)
    got = [run(lim.wait()) for _ in range(3)]
    expect = random.Random(7)
    assert slept == got == [expect.uniform(0, 0.25) for _ in range(3)]
    assert all(0 <= s <= 0.25 for s in slept)


def test_over_the_rate_limit_a_request_fails_with_its_own_503():
    """Burst 1: the first request migrates, the second (same instant) is refused with a 503 naming the
    limit; a second later the bucket has a token again."""
    t = [0.0]
    lim = MigrationLimits(rate_per_s=1.0, burst=1, jitter_s=0, now=lambda: t[0])

    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=2, times=3), model()
            out = []
            async with router(cl, config(), limits=lim) as (c, d):
                d.main.peers[1].running = 5  # MD 1 first in line (another prompt each: no cache hit)
                for i, at in enumerate((0.0, 0.0, 1.0)):
                    t[0] = at
                    r = await c.post("/generate", json={**generate_body(6), "input_ids": [20 + i, 5, 6]})
                    out.append((r.status, await r.text()))
                metrics = await (await c.get("/metrics")).text()
            return out, metrics

    out, metrics = run(go())
    (s1, t1), (s2, t2), (s3, t3) = out
    assert s1 == 200 and json.loads(t1)["output_ids"] == reference(6)
    assert s2 == 503 and "--migration-rate 1/s, --migration-burst 1" in t2 and "not migrated" in t2
    assert s3 == 200 and json.loads(t3)["output_ids"] == reference(6)
    assert migrations_by_cause(metrics) == {("broken", "completed"): 2, ("broken", "not-migrated"): 1}


def test_each_migration_waits_its_jitter_first():
    slept = []

    async def sleep(s):
        slept.append(s)

    lim = MigrationLimits(rate_per_s=0, jitter_s=0.5, rng=random.Random(3), sleep=sleep)

    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=2), model()
            async with router(cl, config(), limits=lim) as (c, _):
                r = await c.post("/generate", json=generate_body(6))
                return r.status, await r.json()

    status, out = run(go())
    assert status == 200 and out["output_ids"] == reference(6)
    assert slept == [random.Random(3).uniform(0, 0.5)]
