"""Testbed lifecycle (root; skipped otherwise): idempotent up/down, fail closed, cleanup that leaves
nothing behind and stops only what the testbed started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sglang_pdd.lab.testbed import Testbed
from sglang_pdd.lab.testbed.probe import echo_rtts
from sglang_pdd.lab.testbed.state import DaemonRecord, RunState, find_daemons


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _root_raw_rules() -> str:
    return subprocess.run(["iptables", "-w", "-t", "raw", "-S"], capture_output=True, text=True).stdout


def _assert_gone(tb: Testbed) -> None:
    assert not {tb.ns("A").name, tb.ns("B").name} & _netns_names()
    for side in ("A", "B"):
        assert find_daemons(tb.daemon_tag(side)) == []
    assert not RunState.path(tb.run_dir, tb.prefix).exists()


def _echo_ok(tb: Testbed, port: int) -> float:
    return min(tb.ns("A").call(echo_rtts, tb.addr("B"), port, 3, timeout=20)) * 1e3


def test_up_is_idempotent_and_keeps_a_healthy_testbed(testbed_factory):
    tb = testbed_factory(delay_ms=5.0, rate_mbit=None)
    pids = tb.daemon_pids()
    assert set(pids) == {"A", "B"} and tb.is_up()
    tb.up()
    same = Testbed(tb.prefix, delay_ms=5.0, rate_mbit=None, run_dir=tb.run_dir).up()  # another handle
    assert tb.daemon_pids() == same.daemon_pids() == pids
    changed = Testbed(tb.prefix, delay_ms=8.0, rate_mbit=None, run_dir=tb.run_dir).up()
    assert changed.is_up() and changed.daemon_pids() != pids  # a different link: rebuilt
    with changed.probe_server("B") as port:
        assert _echo_ok(changed, port) >= 0.9 * 16.0
    changed.down()


def test_link_fails_closed_when_a_delay_daemon_dies(testbed_factory):
    tb = testbed_factory(delay_ms=5.0, rate_mbit=None)
    with tb.probe_server("B") as port:
        assert _echo_ok(tb, port) >= 0.9 * 10.0
        conn = tb.ns("A").call(socket.create_connection, (tb.addr("B"), port), 5.0, timeout=10)
        conn.sendall(b"E" + (8).to_bytes(8, "big"))
        conn.sendall(b"x" * 8)
        assert conn.recv(8) == b"x" * 8  # established and echoing

        os.kill(tb.daemon_pids()["B"], signal.SIGKILL)  # the daemon delaying A -> B
        time.sleep(0.2)
        conn.settimeout(1.5)
        conn.sendall(b"y" * 8)
        with pytest.raises(socket.timeout):
            conn.recv(8)  # the established flow stalls instead of running undelayed
        conn.close()
        with pytest.raises(OSError):  # and no new connection gets through
            tb.ns("A").call(socket.create_connection, (tb.addr("B"), port), 1.5, timeout=10)
        assert not tb.is_up()
    tb.up()  # a dead daemon makes up() rebuild
    with tb.probe_server("B") as port:
        assert _echo_ok(tb, port) >= 0.9 * 10.0


def test_down_leaves_no_namespace_daemon_rule_or_state(testbed_factory):
    rules_before = _root_raw_rules()
    tb = testbed_factory(delay_ms=2.0, rate_mbit=100.0)
    assert tb.is_up() and {tb.ns("A").name, tb.ns("B").name} <= _netns_names()
    tb.down()
    _assert_gone(tb)
    assert _root_raw_rules() == rules_before  # rules lived in the namespaces only
    tb.down()  # idempotent
    _assert_gone(tb)


def test_down_stops_only_what_it_started(testbed_factory):
    mine = testbed_factory(delay_ms=2.0, rate_mbit=None)
    other = testbed_factory(delay_ms=2.0, rate_mbit=None)
    # A stranger whose PID the state file names, as if a recorded daemon's PID had been recycled.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        st = RunState.load(mine.run_dir, mine.prefix)
        st.daemons.append(DaemonRecord(stranger.pid, mine.daemon_tag("A"), "A"))
        st.save(mine.run_dir)
        mine.down()
        _assert_gone(mine)
        assert stranger.poll() is None, "down() killed a process it did not start"
        assert other.is_up()
        with other.probe_server("B") as port:
            assert _echo_ok(other, port) >= 0.9 * 4.0
    finally:
        stranger.kill()
        stranger.wait()


def test_reconfigure_changes_the_link_and_keeps_what_runs(testbed_factory):
    tb = testbed_factory(delay_ms=20.0, rate_mbit=None)
    with tb.probe_server("B") as port:
        before = _echo_ok(tb, port)
        assert before >= 0.9 * 40.0
        tb.reconfigure(delay_ms=5.0)
        after = _echo_ok(tb, port)  # the same server, still running
        # relative to `before`, so a loaded box (slow wakeups add to both) does not matter
        assert 0.9 * 10.0 <= after < before - 15.0, (before, after)
    assert tb.is_up() and RunState.load(tb.run_dir, tb.prefix).config["delay_ms"] == 5.0


def test_cli_up_probe_down(tmp_path):
    prefix = f"pc{os.getpid()}"
    cli = [sys.executable, "-m", "sglang_pdd.lab.testbed"]
    where = ["--prefix", prefix, "--run-dir", str(tmp_path)]
    try:
        up = subprocess.run([*cli, "up", *where, "--delay-ms", "10", "--rate-mbit", "100"],
                            capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stderr
        probe = subprocess.run([*cli, "probe", *where, "--bulk-mb", "4", "--json"],
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stderr
        rep = json.loads(probe.stdout)
        assert rep["config"]["delay_ms"] == 10.0 and rep["backend"] in ("nfqueue", "netem")
        assert rep["measured"]["rtt_ms_p50"] >= 0.9 * 20  # accuracy: test_wan_link.py
        assert rep["link_bytes"]["A->B"] >= 4e6 and rep["link_bytes"]["B->A"] >= 4e6
        table = subprocess.run([*cli, "probe", *where, "--bulk-mb", "1"], capture_output=True, text=True, timeout=120)
        assert "configured" in table.stdout and "RTT (ms)" in table.stdout
    finally:
        down = subprocess.run([*cli, "down", *where], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    _assert_gone(Testbed(prefix, run_dir=tmp_path))
    gone = subprocess.run([*cli, "probe", *where], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "not up" in gone.stderr


@pytest.mark.usefixtures("testbed_factory")  # for its skip reasons
def test_fixture_prunes_namespaces_of_dead_pytest_runs_only():
    from sglang_pdd.lab.testbed.netns import NetNS
    from sglang_pdd.lab.testbed.pytest_plugin import prune_stale

    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = subprocess.Popen(["sleep", "60"])
    stale, live = NetNS(f"pt{gone.pid}n0A").create(), NetNS(f"pt{alive.pid}n0A").create()
    try:
        assert stale.name in prune_stale()
        assert not stale.exists() and live.exists()
    finally:
        live.delete()
        stale.delete()
        alive.kill()
        alive.wait()


@pytest.mark.usefixtures("testbed_factory")
def test_netem_backend_is_used_or_refused_clearly(tmp_path):
    from sglang_pdd.lab.testbed.netns import NetNS
    from sglang_pdd.lab.testbed import TestbedError
    from sglang_pdd.lab.testbed.link import netem_available

    probe_ns = NetNS(f"pn{os.getpid()}").create()
    try:
        has_netem = netem_available(probe_ns)
    finally:
        probe_ns.delete()
    tb = Testbed(f"pn{os.getpid()}x", delay_ms=5.0, rate_mbit=100.0, backend="netem", run_dir=tmp_path)
    try:
        if not has_netem:
            with pytest.raises(TestbedError, match="netem"):
                tb.up()
            _assert_gone(tb)
        else:
            tb.up()
            assert tb.backend == "netem" and tb.daemon_pids() == {}
            with tb.probe_server("B") as port:
                assert 0.9 * 10.0 <= _echo_ok(tb, port) <= 1.5 * 10.0 + 5.0
    finally:
        tb.down()


def _connect_from_port(port: int) -> int:
    """Listen on `port` on loopback, connect to it, return the client's (ephemeral) source port."""
    with socket.create_server(("127.0.0.1", port)) as srv, socket.create_connection(("127.0.0.1", port)) as c:
        return c.getsockname()[1]


def test_namespaces_draw_ephemeral_ports_above_the_fixed_server_ports(testbed_factory):
    # CI once lost a server start to EADDRINUSE on its --nccl-port 33201: the Linux default ephemeral
    # range (32768-60999) covers the fixed ports the tests give servers; every namespace moves it up
    from sglang_pdd.lab.testbed.netns import EPHEMERAL_PORTS

    tb = testbed_factory(delay_ms=1.0, rate_mbit=None)
    lo, hi = EPHEMERAL_PORTS
    for side in ("A", "B"):
        assert tb.ns(side).ephemeral_ports() == (lo, hi)
        assert lo <= tb.ns(side).call(_connect_from_port, 33201, timeout=20) <= hi
