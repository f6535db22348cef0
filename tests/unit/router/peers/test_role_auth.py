"""The router calls its roles with their key: every call the dispatcher's session makes (P's, RLD's and
MD's /generate, /abort_request, the load poll's /metrics, the health checker's /health) carries
`Authorization: Bearer KEY` (the role-lock check alone asks without it: test_role_lock.py), checked by sglang's own rule (`decide_request_auth`) in fake roles on real
aiohttp servers; without the key the roles refuse the router (the control). The key's configuration:
environment or file, the flag, their conflicts."""

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.peers import role_auth, role_lock
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher

KEY = "role-key-0123"


class KeyedRole(fu.FakeRole):
    """A fake role behind sglang's --api-key check; it records (path, Authorization) of every call."""

    def __init__(self, role: str):
        super().__init__(role)
        self.calls: list[tuple[str, str | None]] = []

    def app(self) -> web.Application:
        from sglang.srt.utils.auth import AuthLevel, decide_request_auth

        @web.middleware
        async def check(request, handler):
            authz = request.headers.get("Authorization")
            self.calls.append((request.path, authz))
            level = AuthLevel.ADMIN_OPTIONAL if request.path == "/abort_request" else AuthLevel.NORMAL
            if not decide_request_auth(method=request.method, path=request.path, authorization_header=authz,
                                       api_key=KEY, admin_api_key=None, auth_level=level).allowed:
                return web.json_response({"error": "Unauthorized"}, status=401)
            return await handler(request)

        app = super().app()
        app.middlewares.append(check)
        app.add_routes([web.get("/metrics", lambda _r: web.Response(text="# nothing\n"))])
        return app


async def _wait(cond, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _session_calls():
    """One request served, one failed by MD (the router aborts every copy), the polls and a health
    probe of RLD (ejected, so the checker asks it): every role's recorded calls."""
    cl = fu.FakeCluster(prefill=KeyedRole("prefill"), relay=KeyedRole("relay"), main=KeyedRole("main"))
    async with cl:
        cfg = DispatchConfig("direct", request_timeout_s=30, bandwidth_poll_s=0, load_poll_s=0.02,
                             idle_timeout_s={r: 30 for r in ("prefill", "relay", "main")},
                             migration_limit=0, health_check_s=0.02)
        tok = fu.CharTokenizer()
        d = Dispatcher(*cl.pools(), cfg, decode=lambda ids: tok.decode(ids))
        d.relay.peers[0].health.failed(unreachable=True)  # out: the health checker probes it
        app = RouterApp(d, tok, "fake", limits=ModelLimits(vocab_size=1024, context_len=1 << 16))
        statuses = []
        async with TestClient(TestServer(app.app)) as c:
            body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4}}
            statuses.append((await c.post("/generate", json=body)).status)
            cl.main.behaviour = fu.status(500, "boom")
            statuses.append((await c.post("/generate", json=body)).status)
            await _wait(lambda: all(any(p == "/metrics" for p, _ in r.calls) for r in (cl.prefill, cl.relay, cl.main))
                        and any(p == "/health" for p, _ in cl.relay.calls)
                        and any(p == "/abort_request" for p, _ in cl.main.calls), "every kind of call")
        return statuses, cl


def test_every_call_of_the_router_to_a_role_carries_the_key(monkeypatch):
    monkeypatch.setenv(role_auth.ENV_KEY, KEY)
    statuses, cl = asyncio.run(asyncio.wait_for(_session_calls(), 60))
    assert statuses == [200, 502]
    for r in (cl.prefill, cl.relay, cl.main):
        # the one call without it: the router's check that the role asks for it (peers.role_lock), at start
        assert [a for p, a in r.calls if p == role_lock.PATH] == [None], (r.role, r.calls)
        calls = [a for p, a in r.calls if p != role_lock.PATH]
        assert calls and set(calls) == {f"Bearer {KEY}"}, (r.role, r.calls)
    assert {p for p, _ in cl.prefill.calls + cl.main.calls} >= {"/generate", "/abort_request", "/metrics"}
    assert cl.main.aborts and cl.prefill.aborts  # the aborts passed the roles' check


def test_control_a_router_without_the_key_is_refused(monkeypatch):
    monkeypatch.delenv(role_auth.ENV_KEY, raising=False)
    monkeypatch.delenv(role_auth.ENV_KEY_FILE, raising=False)
    statuses, cl = asyncio.run(asyncio.wait_for(_session_calls(), 60))
    assert statuses[0] != 200
    assert {a for r in (cl.prefill, cl.main) for _, a in r.calls} == {None}
    assert cl.prefill.bodies == cl.main.bodies == []  # no /generate got past the check


def test_the_key_from_the_environment_a_file_or_the_flag(tmp_path):
    f = tmp_path / "role.key"
    f.write_text(KEY + "\n")
    assert role_auth.load({}) is None and role_auth.headers({}) is None
    assert role_auth.load({role_auth.ENV_KEY: KEY}) == KEY
    assert role_auth.headers({role_auth.ENV_KEY_FILE: str(f)}) == {"Authorization": f"Bearer {KEY}"}
    env = {}
    assert role_auth.export(KEY, env) == KEY and role_auth.load(env) == KEY  # the flag: the same path
    assert role_auth.export(None, {role_auth.ENV_KEY: KEY}) == KEY
    with pytest.raises(ValueError, match="--role-api-key and SGLANG_PDD_ROLE_API_KEY .* both set"):
        role_auth.export(KEY, {role_auth.ENV_KEY: KEY})
    with pytest.raises(ValueError, match="set one"):
        role_auth.load({role_auth.ENV_KEY: KEY, role_auth.ENV_KEY_FILE: str(f)})
    with pytest.raises(ValueError, match="SGLANG_PDD_ROLE_API_KEY_FILE: cannot read"):
        role_auth.load({role_auth.ENV_KEY_FILE: str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="SGLANG_PDD_ROLE_API_KEY_FILE: the key is empty"):
        role_auth.load({role_auth.ENV_KEY_FILE: str(tmp_path / "empty")})
    for bad in ("two words", "line\nbreak", "tab\t"):
        with pytest.raises(ValueError, match="--role-api-key: the key must be printable ASCII"):
            role_auth.export(bad, {})


def test_the_router_refuses_to_start_with_a_bad_key(monkeypatch):
    from sglang_pdd.router.__main__ import main

    monkeypatch.setenv(role_auth.ENV_KEY, KEY)
    with pytest.raises(SystemExit, match="--role-api-key and SGLANG_PDD_ROLE_API_KEY"):
        main(["--prefill", "http://p:1", "--main", "http://m:1", "--tokenizer", "t", "--role-api-key", KEY])
