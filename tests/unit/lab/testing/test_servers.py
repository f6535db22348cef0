"""The server harness starts, probes and stops exactly its own process tree."""

import os
import sys
import textwrap
import time

import pytest

from sglang_pdd.lab.testing.servers import ServerGroup, ServerStartError, free_port, http_json

HTTP_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"ok": true}')
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


class Script:
    def __init__(self, code: str, port: int):
        self.code, self.port = code, port
        self.url = f"http://127.0.0.1:{port}"

    def argv(self):
        return [sys.executable, "-c", self.code, str(self.port)]

    def environ(self):
        return {}


def test_start_wait_and_stop_the_whole_process_group(tmp_path):
    with ServerGroup(str(tmp_path)) as group:
        s = group.start("web", Script(HTTP_SERVER, free_port())).wait_ready(timeout_s=30)
        assert http_json(s.url + "/health")[0] == 200
        pids = s.group_pids()
        assert len(pids) == 2  # the server and the child it spawned
    assert s.group_pids() == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_server_that_dies_while_starting_raises_with_its_log(tmp_path):
    with ServerGroup(str(tmp_path)) as group:
        s = group.start("broken", Script("import sys; print('bad flag --x'); sys.exit(3)", free_port()))
        with pytest.raises(ServerStartError, match=r"exited \(3\)[\s\S]*bad flag --x"):
            s.wait_ready(timeout_s=30)


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def test_a_group_stops_together_and_kills_what_ignores_sigterm(tmp_path):
    """The group is signalled at once (one grace period for all, not one each): a server that ignores
    SIGTERM is SIGKILLed after the grace, the well-behaved ones are gone, a dead one is skipped."""
    from sglang_pdd.lab.testing.servers import stop_all

    group = ServerGroup(str(tmp_path))
    web = group.start("web", Script(HTTP_SERVER, free_port())).wait_ready(timeout_s=30)
    stubborn = group.start("stubborn", Script(STUBBORN, free_port()))
    dead = group.start("dead", Script("pass", free_port()))
    dead.proc.wait(timeout=30)
    while "up" not in stubborn.log_text():
        assert stubborn.alive()
        time.sleep(0.05)
    stop_all(group.servers, grace_s=0.5)
    assert web.group_pids() == [] and stubborn.group_pids() == [] and dead.group_pids() == []
    assert stubborn.proc.returncode == -9 and web.proc.returncode != -9


def test_a_group_without_grace_kills_at_once(tmp_path):
    """`grace_s=0` (the test fixtures' groups): SIGKILL, no SIGTERM first, even to a server that would
    have exited on it."""
    with ServerGroup(str(tmp_path), grace_s=0) as group:
        web = group.start("web", Script(HTTP_SERVER, free_port())).wait_ready(timeout_s=30)
        pids = web.group_pids()
    assert web.group_pids() == [] and web.proc.returncode == -9, (pids, web.proc.returncode)
