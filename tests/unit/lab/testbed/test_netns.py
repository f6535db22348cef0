import os
import subprocess
import sys
import time

import pytest

from sglang_pdd.lab.testbed.netns import NetNS, netns_supported

ok, why = netns_supported()
pytestmark = pytest.mark.skipif(not ok, reason=why)


@pytest.fixture
def ns():
    n = NetNS(f"pdd-unit-{os.getpid()}").create()
    yield n
    n.delete()


def test_namespace_has_only_loopback_up(ns):
    links = ns.run(["ip", "-o", "link"]).stdout.splitlines()
    assert len(links) == 1 and "lo:" in links[0] and "UP" in links[0]


def test_entering_moves_the_process_and_its_children(ns):
    code = (
        "import subprocess, sys; from sglang_pdd.lab.testbed.netns import NetNS; NetNS(sys.argv[1]).enter(); "
        "print(open('/proc/self/ns/net').name, subprocess.run(['readlink', '/proc/self/ns/net'], "
        "capture_output=True, text=True).stdout.strip())"
    )
    inside = subprocess.run([sys.executable, "-c", code, ns.name], capture_output=True, text=True, check=True)
    expected = subprocess.run(ns.argv(["readlink", "/proc/self/ns/net"]), capture_output=True, text=True).stdout
    assert inside.stdout.split()[-1] == expected.strip()
    assert expected.strip() != os.readlink("/proc/self/ns/net")


def started_inside(ns, argv) -> subprocess.Popen:
    """Start `argv` in `ns` and wait until it really runs there (`ip netns exec` enters it first)."""
    proc = subprocess.Popen(ns.argv(argv))
    for _ in range(100):
        if proc.pid in ns.pids():
            return proc
        time.sleep(0.05)
    raise AssertionError("process never showed up inside the namespace")


def test_delete_kills_what_runs_inside_and_nothing_else(ns):
    inside = started_inside(ns, ["sleep", "60"])
    outside = subprocess.Popen(["sleep", "60"])
    try:
        assert inside.pid in ns.pids() and outside.pid not in ns.pids()
        ns.delete()
        assert inside.wait(timeout=10) != 0
        assert outside.poll() is None
        assert not ns.exists()
    finally:
        outside.kill()
        outside.wait()


def test_create_replaces_a_stale_namespace_of_the_same_name(ns):
    stale = started_inside(ns, ["sleep", "60"])
    NetNS(ns.name).create()
    assert stale.wait(timeout=10) != 0
    assert ns.pids() == []
