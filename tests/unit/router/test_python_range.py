"""The router's unit tests on the highest Python the package declares (pyproject's classifiers).

The main run is the lowest (`requires-python`: the 3.11 venv of scripts/install-cpu.sh). This test finds
the highest declared interpreter, builds a venv of it under `.artifacts/` holding the package with its
`router` extra only (no torch, sglang or xgrammar: they are pinned for 3.11 and not needed to route), and
runs tests/unit/router there under CI=true, where a skip is a failure. The tests that need what the extra
does not bring (LEFT_TO_THE_MAIN_RUN) are left out by name, so a new such test fails here until it is
listed. The venv is reused while its inputs (the interpreter, pyproject, setup.py, the pins) are unchanged.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.relpath(os.path.abspath(__file__), REPO)
PINS = ("requirements/sglang-cpu.txt", "requirements/dev.txt")  # constraints: the main run's versions
STAMP_INPUTS = ("pyproject.toml", "setup.py") + PINS
MIN_SHARE = 0.8  # of the tests the main interpreter collects under tests/unit/router
# The network namespace this process had when pytest imported the module (collection, before tests/conftest's
# private_netns moves the process into one of its own, where no package index is reached): pip runs in it.
try:
    HOST_NETNS = os.open("/proc/self/ns/net", os.O_RDONLY)
except OSError:
    HOST_NETNS = None


def _in_host_netns() -> None:
    """preexec_fn: the child joins HOST_NETNS before it runs pip (setns(2); Python 3.11 has no os.setns)."""
    if HOST_NETNS is not None:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).setns(HOST_NETNS, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns to the host network namespace")

# file (under tests/unit/router) -> (what its tests need, the tests that need it; none: the whole file, not imported)
LEFT_TO_THE_MAIN_RUN: dict[str, tuple[str, list[str]]] = {
    "api/grammar/test_guard.py": ("xgrammar, sglang's xgrammar backend", []),
    "api/openai/test_role_requests.py": ("sglang's chat layer on tiny_model", []),
    "api/openai/test_special_token_tools.py": ("sglang's chat layer on tiny_model", []),
    "api/openai/test_sglang_server.py": ("sglang's chat layer on tiny_model", [
        "test_tool_choice_required_is_constrained_as_sglang_constrains_it",
        "test_the_tool_call_comes_back_whole_and_streamed",
        "test_logprobs_and_top_logprobs_in_openais_shape",
        "test_top_logprobs_over_openais_bound_is_a_400",
        "test_twenty_top_logprobs_are_served",
        "test_a_failure_after_the_first_token_ends_the_stream_with_an_error_and_done",
        "test_sglangs_own_refusals_are_a_400",
        "test_an_unknown_parser_is_refused_at_start_naming_the_flag"]),
    "cache/test_kv_events.py": ("torch, sglang's radix cache", [
        "test_the_view_matches_sglangs_radix_cache_through_inserts_and_evictions"]),
    "cache/test_kv_subscriber.py": ("sglang's KV-event publisher", [
        "test_the_subscriber_follows_sglangs_zmq_publisher_and_replays_what_it_missed"]),
    "request/test_incremental_text.py": ("tiny_model's tokenizer (built with sglang)", [
        "test_a_real_byte_level_tokenizer_bounded_and_exact"]),
    "peers/test_role_auth.py": ("fake roles keyed by sglang's own rule (sglang.srt.utils.auth)", [
        "test_every_call_of_the_router_to_a_role_carries_the_key",
        "test_control_a_router_without_the_key_is_refused"]),
    "peers/test_role_lock.py": ("fake roles keyed by sglang's own rule (sglang.srt.utils.auth)", [
        "test_an_open_role_is_refused_service_and_the_router_is_not_ready",
        "test_control_every_role_keyed_serves",
        "test_control_without_the_check_the_open_role_serves",
        "test_an_open_replica_gets_nothing_even_when_every_other_is_out",
        "test_a_role_is_checked_when_it_first_answers_and_again_later"]),
}


def left_out_args() -> list[str]:
    """--ignore for a whole file, --deselect for each test (a node-id prefix: every parametrization)."""
    args = []
    for f, (_, tests) in LEFT_TO_THE_MAIN_RUN.items():
        path = f"tests/unit/router/{f}"
        args += [f"--deselect={path}::{t}" for t in tests] if tests else [f"--ignore={path}"]
    return args


def declared_pythons() -> tuple[str, list[tuple[int, int]]]:
    """requires-python, and the X.Y of the classifiers, lowest first."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    found = (re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c) for c in project.get("classifiers", []))
    return project["requires-python"], sorted((int(m[1]), int(m[2])) for m in found if m)


def _probe(python: str) -> tuple[str, str] | None:
    """(sys.executable, X.Y.Z) of a candidate, None where it does not run (a pyenv shim of a version not
    selected exits 127)."""
    code = "import sys; print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])"
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    lines = r.stdout.split()
    return (lines[0], lines[1]) if r.returncode == 0 and len(lines) == 2 else None


def find_python(major: int, minor: int) -> tuple[str, str] | None:
    """`pythonX.Y` on PATH, else the newest pyenv install of X.Y ($PYENV_ROOT, `pyenv root`, ~/.pyenv)."""
    name = f"python{major}.{minor}"
    candidates = [p for p in [shutil.which(name)] if p]
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    if shutil.which("pyenv"):
        roots.append(subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip())
    for root in filter(None, dict.fromkeys(roots)):
        found = glob.glob(os.path.join(root, "versions", f"{major}.{minor}.*", "bin", name))
        candidates += sorted(found, key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("versions")[-1])],
                             reverse=True)
    for c in candidates:
        got = _probe(c)
        if got and got[1].startswith(f"{major}.{minor}."):
            return got
    return None


def router_venv(python: str, version: str, artifacts: str) -> tuple[str, float | None]:
    """The venv's python, and the seconds it took to build (None: reused). Locked: other runs share the tree."""
    venv = os.path.join(artifacts, f"router-py{version.rsplit('.', 1)[0]}")
    digest = hashlib.sha256(f"{python} {version}".encode())
    for f in STAMP_INPUTS:
        with open(os.path.join(REPO, f), "rb") as fh:
            digest.update(fh.read())
    stamp, vpy = os.path.join(venv, ".sglang-pdd-stamp"), os.path.join(venv, "bin", "python")
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(vpy) and os.path.exists(stamp):
            with open(stamp) as fh:
                if fh.read() == digest.hexdigest():
                    return vpy, None
        t0 = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", venv], check=True, timeout=120)
        egg_info = os.path.join(REPO, "sglang_pdd.egg-info")
        had_egg_info = os.path.exists(egg_info)
        pins = [a for p in PINS for a in ("-c", os.path.join(REPO, p))]
        # --no-compile: bytecode for all of transformers is most of pip's CPU time; the tests import a few
        r = subprocess.run([vpy, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", *pins,
                            "-e", f"{REPO}[router]", "pytest", "pytest-timeout"],
                           capture_output=True, text=True, timeout=420, preexec_fn=_in_host_netns)
        if not had_egg_info:  # setuptools' by-product in the tree (the main venv's metadata is in its site-packages)
            shutil.rmtree(egg_info, ignore_errors=True)
        noise = "is ignored: it is neither a file nor a directory"
        out = "\n".join(line for line in (r.stdout + r.stderr).splitlines() if noise not in line)
        assert r.returncode == 0, f"pip install into the Python {version} venv failed:\n{out[-4000:]}"
        with open(stamp, "w") as fh:
            fh.write(digest.hexdigest())
        return vpy, time.monotonic() - t0


def test_the_list_left_to_the_main_run_names_what_exists():
    for f, (_, tests) in LEFT_TO_THE_MAIN_RUN.items():
        with open(os.path.join(REPO, "tests/unit/router", f)) as fh:
            source = fh.read()
        defined = re.findall(r"^(?:async )?def (test\w*)\(", source, re.M)
        for t in tests:
            assert t in defined, f"{f}::{t}: no such test (renamed? update LEFT_TO_THE_MAIN_RUN)"
            # --deselect takes a node-id prefix: no other test's name may begin with this one
            assert [d for d in defined if d.startswith(t)] == [t], f"{f}::{t} is the start of another test's name"


@pytest.mark.timeout(600)
def test_the_router_unit_tests_pass_on_the_highest_declared_python(artifacts_dir, figures, tmp_path):
    requires, pythons = declared_pythons()
    assert pythons and requires == ">=%d.%d" % pythons[0], f"the lowest classifier of {pythons} is not {requires}"
    found = find_python(*pythons[-1])
    if found is None:
        pytest.skip(f"python{'.'.join(map(str, pythons[-1]))} (the highest declared) is not on PATH or in pyenv")
    python, version = found
    xml = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    with open(tmp_path / "collected.txt", "w+") as out:
        # what the main interpreter collects under tests/unit/router, alongside (it imports torch: seconds of CPU)
        main = subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 "tests/unit/router"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            vpy, built_s = router_venv(python, version, artifacts_dir)
            r = subprocess.run([vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/router",
                                f"--ignore={HERE}", *left_out_args(), f"--junitxml={xml}"],
                               cwd=REPO, env={**env, "CI": "true"}, capture_output=True, text=True, timeout=420)
            main.wait(timeout=120)
        finally:
            if main.poll() is None:
                main.kill()
                main.wait()
        out.seek(0)
        collected = out.read()
    assert r.returncode == 0, f"tests/unit/router on Python {version}:\n{(r.stdout + r.stderr)[-6000:]}"
    main_total = sum("::" in line and not line.startswith(HERE) for line in collected.splitlines())
    assert main.returncode == 0 and main_total > 0, collected[-3000:]
    suite = ET.parse(xml).getroot().find("testsuite")
    ran = int(suite.get("tests"))
    passed = ran - sum(int(suite.get(k)) for k in ("failures", "errors", "skipped"))
    assert passed >= MIN_SHARE * main_total, (
        f"Python {version} passed {passed} of the {main_total} tests Python {sys.version.split()[0]} collects: "
        f"under {MIN_SHARE:.0%}; is LEFT_TO_THE_MAIN_RUN growing?")
    venv = f"venv built in {built_s:.0f} s" if built_s is not None else "venv reused"
    figures.append(f"router unit tests on Python {version}: {passed} passed of the {main_total} Python "
                   f"{sys.version.split()[0]} collects ({main_total - ran} in {len(LEFT_TO_THE_MAIN_RUN)} files "
                   f"need sglang, torch or xgrammar: left to that run; {venv})")
