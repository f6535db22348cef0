"""Shared fixtures: the tiny model, a private network namespace, and real sglang servers in it.

Server tests (marked `e2e`) run every server inside one private network namespace that the test
process itself enters at the start of the session (sglang's `--nccl-port` store and Mooncake listen
on all interfaces). Artifacts (model cache, server logs) go under `.artifacts/` in the repo, or
`$SGLANG_PDD_ARTIFACTS`.

Under `CI=true` nothing is skipped: a test that would skip (no sglang, no root for namespaces, no
triton) fails with the reason. The session ends with the figures tests reported (`figures` fixture)
and the number of e2e tests that ran.
"""

from __future__ import annotations

import os
import time

import pytest

CI = os.environ.get("CI", "").lower() == "true"
FIGURES: list[str] = []  # lines tests report, printed at the end of the session
SHARED_CLUSTERS = pytest.StashKey()  # the session's tests.e2e.shared_cluster.SharedClusters
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.environ.get("SGLANG_PDD_ARTIFACTS", os.path.join(REPO, ".artifacts"))
# The token channel's shared secret for every relay/main server the tests start.
os.environ.setdefault("SGLANG_PDD_SECRET", "sglang-pdd-test-secret")
# Lets e2e tests ask a server for a negative control (e.g. MD discarding the eager tokens' KV).
os.environ.setdefault("SGLANG_PDD_TESTING", "1")
# sglang's scheduler and detokenizer forked from the launcher, not spawned (sglang_pdd.lab.compat.fork_children):
# each test server's start then skips two imports of sglang and torch. The KEYED cluster's roles spawn, as
# users' servers do (tests/e2e/shared_cluster.py), and test_pdd_router asserts it.
os.environ.setdefault("SGLANG_PDD_CPU_FORK_CHILDREN", "1")
# sglang modules that serve the test models: the tiny Llama (llama) and the MLA model (deepseek_v2)
TEST_MODEL_MODULES = ("llama", "deepseek_v2")


def _unused_model_modules() -> str:
    """sglang's other model modules, for its SGLANG_DISABLED_MODEL_ARCHS: a server imports every module of
    sglang.srt.models when it starts (~250, about 1 s of CPU per scheduler process; a CI run starts some 70),
    and the test servers serve only the test models."""
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return ""
    models = os.path.join(os.path.dirname(spec.origin), "srt", "models")
    return ",".join(m.name for m in pkgutil.iter_modules([models]) if not m.ispkg and m.name not in TEST_MODEL_MODULES)


os.environ.setdefault("SGLANG_DISABLED_MODEL_ARCHS", _unused_model_modules())


def _sglang_importable() -> tuple[bool, str]:
    try:
        import sglang  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the environment
        return False, f"sglang environment not installed ({e}); run scripts/install-cpu.sh"
    return True, ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome, rep.longrepr = "failed", f"skipped under CI=true, which must run everything: {reason}"


def pytest_collection_modifyitems(config, items):
    from tests.e2e.shared_cluster import group_by_cluster

    group_by_cluster(items)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    shared = item.config.stash.get(SHARED_CLUSTERS, None)
    if shared is not None:
        shared.close_after(nextitem)


def pytest_terminal_summary(terminalreporter):
    from sglang_pdd.lab.testing import identity

    tr = terminalreporter
    if identity.COMPARED[0]:
        FIGURES.extend(identity.summary())
    if FIGURES:
        tr.section("sglang-pdd figures")
        for line in FIGURES:
            tr.write_line(line)
    ran = [r for key in ("passed", "failed") for r in tr.stats.get(key, [])
           if r.when == "call" and (r.nodeid.startswith("tests/e2e/") or "e2e" in r.keywords)]
    tr.write_line(f"sglang-pdd: {len(ran)} e2e tests ran ({sum(r.passed for r in ran)} passed)")


@pytest.fixture(scope="session")
def figures() -> list[str]:
    """Append lines (a test's measured figures) to print them at the end of the session."""
    return FIGURES


@pytest.fixture(scope="session")
def artifacts_dir() -> str:
    os.makedirs(ARTIFACTS, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_model(artifacts_dir) -> str:
    ok, why = _sglang_importable()
    if not ok:
        pytest.skip(why)
    from sglang_pdd.lab.testing.tiny_model import build_cached

    return build_cached(os.path.join(artifacts_dir, "models"))


@pytest.fixture(scope="session")
def prompts(tiny_model):
    from sglang_pdd.lab.testing.prompts import PromptMaker

    return PromptMaker(tiny_model)


@pytest.fixture(scope="session")
def private_netns():
    """Move this test process (and so every server it starts) into a fresh network namespace."""
    from sglang_pdd.lab.testbed.netns import NetNS, netns_supported

    ok, why = netns_supported()
    if not ok:
        pytest.skip(f"server tests need a private network namespace: {why}")
    ns = NetNS(f"pdd-e2e-{os.getpid()}").create()
    ns.enter()
    yield ns
    ns.delete()


@pytest.fixture(scope="session")
def log_dir(artifacts_dir) -> str:
    d = os.path.join(artifacts_dir, "logs", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def reference_server(private_netns, tiny_model, log_dir):
    """A single (non-disaggregated) sglang server: the reference for token identity, greedy and seeded
    (`--pdd-seeded-sampling on`: the position-hashed sampler every PDD role uses)."""
    from sglang_pdd.lab.testing.launch_args import ServerConfig
    from sglang_pdd.lab.testing.servers import ServerGroup

    ss = ServerGroup(log_dir, grace_s=0)
    s = ss.start("reference", ServerConfig(model=tiny_model, port=30000, nccl_port=31000,
                                                extra=["--pdd-seeded-sampling", "on"]))
    try:
        s.wait_ready()
        yield s
    finally:
        ss.stop()


@pytest.fixture(scope="session")
def mla_model(artifacts_dir, tiny_model) -> str:  # tiny_model: skips where sglang is not installed
    """The MLA test model's directory (DeepSeek-V3 architecture, `TinyModelSpec(arch="mla")`)."""
    from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build_cached

    return build_cached(os.path.join(artifacts_dir, "models"), TinyModelSpec(arch="mla"))


@pytest.fixture(scope="session")
def mla_prompts(mla_model):
    from sglang_pdd.lab.testing.prompts import PromptMaker

    return PromptMaker(mla_model)


@pytest.fixture(scope="session")
def mla_reference(private_netns, mla_model, log_dir):
    """A single MLA sglang server (sglang's CPU MLA path, the roles' seeded sampler), shared by the MLA
    modules: the reference for token identity, and test_mla_model's server against transformers."""
    from tests.e2e.mla_cluster import start_reference
    from sglang_pdd.lab.testing.servers import ServerGroup

    ss = ServerGroup(log_dir, grace_s=0)
    try:
        yield start_reference(ss, mla_model, 32009).wait_ready()
    finally:
        ss.stop()


@pytest.fixture(scope="session")
def shared_clusters(request, private_netns, log_dir):
    """The cluster consecutive modules share (tests/e2e/shared_cluster.py); stopped after its last test."""
    from tests.e2e.shared_cluster import SharedClusters

    shared = request.config.stash[SHARED_CLUSTERS] = SharedClusters(log_dir)
    yield shared
    shared.close()


@pytest.fixture(scope="module")
def server_group(private_netns, log_dir):
    """Servers of one test module, stopped when the module is done (keeps memory use bounded)."""
    from sglang_pdd.lab.testing.servers import ServerGroup

    with ServerGroup(log_dir, grace_s=0) as group:  # killed at the end: no test watches it go
        yield group


@pytest.fixture(scope="session")
def patched_sglang_root(tmp_path_factory):
    """A copy of the installed sglang with patches/ applied (sglang_pdd.lab.testing.patched_sglang), built once
    per session for tests/unit/plugin/test_patches.py and tests/e2e/test_patched_sglang.py."""
    import shutil

    from sglang_pdd.lab.testing import patched_sglang

    if shutil.which("git") is None:
        pytest.skip("git is not installed (needed to apply patches/)")
    if patched_sglang.installed_sglang() is None:
        pytest.skip("sglang is not installed; run scripts/install-cpu.sh")
    try:
        return patched_sglang.build(tmp_path_factory.mktemp("sglang-patched"))
    except patched_sglang.PatchError as e:
        pytest.fail(str(e))
