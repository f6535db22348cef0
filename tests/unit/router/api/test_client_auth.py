"""Client API keys at the router (issue 31 item 3a): OpenAI-style `Authorization: Bearer KEY`; a request
without one of the keys is a 401 in OpenAI's error shape, /health and /metrics stay open; the flag wins
over the environment; an empty key is refused at start-up."""

from __future__ import annotations

import asyncio
import json

import pytest

from sglang_pdd.router.api.client_auth import ENV_API_KEY, ClientAuth, keys_from
from sglang_pdd.router.metrics import RouterMetrics
from tests.unit.router.kit.front_door import connect, metrics_text, refused, request, response, served

GEN = json.dumps({"text": "ab", "sampling_params": {"max_new_tokens": 2}}).encode()


def test_only_a_configured_key_gets_through_and_probes_stay_open():
    async def go():
        async with served(app_kw={"api_keys": ("secret-one", "secret-two")}) as (app, port):
            app.d.release.set()
            out = {}
            for name, method, path, body, headers in (
                    ("none", "POST", "/generate", GEN, {}),
                    ("wrong", "POST", "/generate", GEN, {"Authorization": "Bearer secret-on"}),
                    ("basic", "POST", "/v1/completions", GEN, {"Authorization": "Basic secret-one"}),
                    ("models", "GET", "/v1/models", b"", {}),
                    ("one", "POST", "/generate", GEN, {"Authorization": "Bearer secret-one"}),
                    ("two", "GET", "/v1/models", b"", {"Authorization": "bearer secret-two"}),
                    ("health", "GET", "/health", b"", {}),
                    ("metrics", "GET", "/metrics", b"", {})):
                r, w = await connect(port, request(method, path, body, headers))
                out[name] = await response(r)
                w.close()
            return out, refused(await metrics_text(port))
    out, counts = asyncio.run(go())
    for name in ("none", "wrong", "basic", "models"):
        status, headers, body = out[name]
        assert status == 401 and headers["www-authenticate"] == "Bearer", name
        err = json.loads(body)["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key", err
    assert "Authorization: Bearer" in json.loads(out["none"][2])["error"]["message"]
    assert {n: out[n][0] for n in ("one", "two", "health", "metrics")} == {"one": 200, "two": 200, "health": 200,
                                                                           "metrics": 200}
    assert counts["auth"] == 4


def test_the_client_is_the_key_it_presented_never_the_key_itself():
    auth = ClientAuth(["a", "b"], RouterMetrics())
    assert auth.key_index("Bearer b") == 1 and auth.key_index("Bearer a") == 0
    assert auth.key_index("Bearer c") is None and auth.key_index(None) is None and auth.key_index("Bearer ") is None
    assert auth.key_index("Bearer \ud800") is None  # a header that is not valid text: no key, no crash


def test_the_flag_wins_over_the_environment_and_an_empty_key_is_refused():
    assert keys_from(["f"], {ENV_API_KEY: "e"}) == ["f"]
    assert keys_from(None, {ENV_API_KEY: "e1, e2"}) == ["e1", "e2"]
    assert keys_from(None, {}) == [] and keys_from(None, {ENV_API_KEY: " "}) == []
    for flag, env in ((None, {ENV_API_KEY: "a,,b"}), ([""], {})):
        with pytest.raises(ValueError, match="--api-key"):
            keys_from(flag, env)
