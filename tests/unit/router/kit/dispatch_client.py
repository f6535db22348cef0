"""A test client on a real router (Dispatcher + RouterApp) in front of a `fake_upstream.FakeCluster`,
with any `DispatchConfig` setting (fake_upstream.router_client fixes the timeouts) and the dispatcher
at hand (its peers' health, its migration limits)."""

import contextlib

from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher


def config(pipeline: str = "direct", idle_s: float = 30.0, **kw) -> DispatchConfig:
    base = dict(request_timeout_s=60.0, bandwidth_poll_s=0, load_poll_s=0, migration_limit=1, health_check_s=0,
                idle_timeout_s={r: idle_s for r in ("prefill", "relay", "main")}, migration_jitter_s=0.0)
    return DispatchConfig(pipeline, **{**base, **kw})


@contextlib.asynccontextmanager
async def router(cluster: "fu.FakeCluster", cfg: DispatchConfig, limits=None):
    """(client, dispatcher); `limits`: a MigrationLimits to use instead of the configured one."""
    tok = fu.CharTokenizer()
    d = Dispatcher(*cluster.pools(), cfg, decode=tok.decode)
    if limits is not None:
        d.migration_limits = limits
    app = RouterApp(d, tok, "fake", limits=ModelLimits(vocab_size=1024, context_len=1 << 16))
    async with TestClient(TestServer(app.app)) as client:
        yield client, d
