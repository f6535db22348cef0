"""What a client may send the router (issue 14 items 1 and 6), over its HTTP front with fake roles:
the router owns `custom_params.pdd`; a client error is a 4xx with a message and reaches no role; an
upstream 4xx (also one sglang reports inside a 200 stream) stays a 4xx; no message names an internal URL."""

import asyncio

import pytest

from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.lab.testing import fake_upstream as fu

LIMITS = ModelLimits(vocab_size=1024, context_len=64)


def run(coro, guard_s: float = 30.0):
    """Run one scenario; a hang (the bug these tests pin) fails instead of blocking the suite."""
    return asyncio.run(asyncio.wait_for(coro, guard_s))


async def _post(cluster, path, body, pipeline="direct", limits=LIMITS, **kw):
    async with fu.router_client(cluster, pipeline=pipeline, limits=limits, **kw) as c:
        r = await c.post(path, json=body) if not isinstance(body, bytes) else await c.post(path, data=body)
        text = await r.text()
        return r.status, text


CLIENT_PDD = {"v": 1, "relay": "tcp://nohost", "relay_room": 5, "main_room": 7}


@pytest.mark.parametrize("pipeline", ["direct", "relay"])
def test_client_pdd_params_and_bootstrap_keys_never_reach_a_role(pipeline):
    body = {"input_ids": [5, 6, 7], "bootstrap_host": "10.9.9.9", "bootstrap_room": 42, "rid": "mine",
            "sampling_params": {"max_new_tokens": 8, "custom_params": {"pdd": CLIENT_PDD, "mine": 1}}}

    async def go():
        async with fu.FakeCluster() as cl:
            status, _ = await _post(cl, "/generate", body, pipeline=pipeline)
            return status, cl

    status, cl = run(go())
    assert status == 200
    roles = {r.role: r.bodies[0] for r in (cl.prefill, cl.relay, cl.main) if r.bodies}
    assert set(roles) == ({"prefill", "main"} if pipeline == "direct" else {"prefill", "relay", "main"})
    for role, b in roles.items():
        assert b["bootstrap_host"] != "10.9.9.9" and b["bootstrap_room"] != 42 and b["rid"] != "mine"
        custom = b["sampling_params"]["custom_params"]
        assert custom["mine"] == 1  # the client's own custom params pass
        pdd = custom.get("pdd")
        if pipeline == "direct" or role == "relay":
            assert pdd is None, (role, pdd)
        elif role == "main":
            assert pdd["relay"] != "tcp://nohost" and pdd["relay_room"] == roles["prefill"]["bootstrap_room"]
        else:
            assert pdd == {"v": 1, "main_room": roles["main"]["bootstrap_room"]}


def test_the_router_signs_p_and_mds_parameters_for_their_own_rooms():
    """What P and MD verify (protocol.request_auth): the router's signature, bound to each body's room."""
    from sglang_pdd.protocol.request import RequestParamsError, parse
    from sglang_pdd.protocol.request_auth import ParamsSigner, ParamsVerifier

    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "custom_params": {"pdd": CLIENT_PDD}}}

    async def go():
        async with fu.FakeCluster() as cl:
            status, _ = await _post(cl, "/generate", body, pipeline="relay", signer=ParamsSigner(b"k"))
            return status, cl

    status, cl = run(go())
    assert status == 200
    p, md = cl.prefill.bodies[0], cl.main.bodies[0]
    pp, mp = (parse(b["sampling_params"]["custom_params"]) for b in (p, md))
    ParamsVerifier(b"k").check(pp, p["bootstrap_room"])
    ParamsVerifier(b"k").check(mp, md["bootstrap_room"])
    with pytest.raises(RequestParamsError, match="does not match"):  # each is bound to its own body's room
        ParamsVerifier(b"k").check(pp, md["bootstrap_room"])
    with pytest.raises(RequestParamsError, match="does not match"):  # and to the secret
        ParamsVerifier(b"other").check(mp, md["bootstrap_room"])


def test_openai_bodies_cannot_carry_pdd_params():
    body = {"prompt": "abc", "max_tokens": 4, "custom_params": {"pdd": CLIENT_PDD},
            "sampling_params": {"custom_params": {"pdd": CLIENT_PDD}}, "bootstrap_room": 42}

    async def go():
        async with fu.FakeCluster() as cl:
            out = [await _post(cl, path, {**body, "messages": [{"role": "user", "content": "abc"}]})
                   for path in ("/v1/completions", "/v1/chat/completions")]
            return out, cl

    out, cl = run(go())
    assert [s for s, _ in out] == [200, 200]
    for b in cl.prefill.bodies + cl.main.bodies:
        assert "custom_params" not in b["sampling_params"] and b["bootstrap_room"] != 42


GOOD = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}


def sp(**kw):
    return {**GOOD, "sampling_params": kw}


@pytest.mark.parametrize("path, body, match", [
    ("/generate", {**GOOD, "sampling_params": "fast"}, "sampling_params must be a JSON object"),
    ("/generate", {**GOOD, "sampling_params": [1]}, "sampling_params must be a JSON object"),
    ("/generate", sp(max_new_tokens="abc"), "max_new_tokens must be a positive integer"),
    ("/generate", sp(max_new_tokens=-1), "max_new_tokens must be a positive integer"),
    ("/generate", sp(max_new_tokens=2.5), "max_new_tokens must be a positive integer"),
    ("/generate", sp(temperature=-1), "temperature"),
    ("/generate", sp(temperature="hot"), "temperature"),
    ("/generate", sp(top_p=0), "top_p"),
    ("/generate", sp(top_k=0), "top_k"),
    ("/generate", sp(stop_token_ids=[5000]), "outside the model's vocabulary"),
    ("/generate", sp(max_tokens=3), "unknown key 'max_tokens'"),
    ("/generate", sp(custom_params="x"), "custom_params must be a JSON object"),
    ("/generate", {"input_ids": [5, 10 ** 7]}, "token id 10000000 is outside the model's vocabulary"),
    ("/generate", {"input_ids": [-1, 5]}, "token id -1 is outside"),
    ("/generate", {"input_ids": ["a"]}, "input_ids must be integers"),
    ("/generate", {"input_ids": list(range(64))}, "longer than the model's context length (64 tokens)"),
    ("/generate", {"input_ids": list(range(32)), "sampling_params": {"max_new_tokens": 40}}, "exceed the model's context"),
    ("/generate", {"text": "x" * 100}, "longer than the model's context"),
    ("/generate", {"text": "x" * 10 ** 6}, "1000000 characters) is longer than the model's context"),
    ("/generate", {"text": 5}, "non-empty text or input_ids"),
    ("/v1/completions", {"prompt": "ab", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": "9"}, "max_tokens must be a positive integer"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 100}, "exceed the model's context"),
    ("/v1/completions", {"prompt": [5, 10 ** 7]}, "outside the model's vocabulary"),
    ("/v1/completions", {"prompt": "ab", "n": "two"}, "n > 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 80}]}, "context length"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 2}, "top_p"),
    # the second hardening round (issue 31): values sglang's own checks pass but its scheduler dies on,
    # or that make a scheduler thread do unbounded work
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "top_k": 2147483648}, "top_k must be -1 (all) or an integer in [1, "),
    ("/generate", sp(top_k=2**31), "top_k must be -1 (all) or an integer in [1, "),
    ("/generate", sp(top_k=LIMITS.vocab_size + 1), f"[1, {LIMITS.vocab_size}]"),
    ("/generate", sp(top_k=True), "top_k"),
    ("/generate", b'{"input_ids": [5], "sampling_params": {"logit_bias": {"5": NaN}}}', "NaN is not a number"),
    ("/generate", b'{"input_ids": [5], "sampling_params": {"temperature": Infinity}}', "Infinity is not a number"),
    ("/generate", b'{"input_ids": [5], "sampling_params": {"top_p": -Infinity}}', "-Infinity is not a number"),
    ("/generate", sp(logit_bias={"5": 1e308 * 10}), "is not a number"),  # json.dumps writes Infinity
    ("/generate", sp(logit_bias={"5": 101}), "logit_bias must map token ids to finite numbers in [-100, 100]"),
    ("/generate", sp(logit_bias={"5": "1"}), "logit_bias must map token ids to finite numbers"),
    # the third round (issue 47): keys that alias one token through int(), and their number
    *[("/generate", sp(logit_bias={k: 1}), "logit_bias keys must be token ids written in decimal digits")
      for k in ("07", "+7", " 7", "0_7", "\u0667", "7 ", "-7", "0x7", "")],
    ("/generate", sp(logit_bias={str(i): 1 for i in range(301)}), "logit_bias: at most 300 token ids, got 301"),
    ("/generate", sp(logit_bias={"1024": 1}), "logit_bias: token id 1024 is outside the model's vocabulary"),
    ("/generate", sp(stream_interval="2"), "stream_interval must be an integer in [1, 64]"),
    ("/generate", sp(stream_interval=0), "stream_interval must be an integer in [1, 64]"),
    ("/generate", sp(stream_interval=10 ** 9), "stream_interval must be an integer in [1, 64]"),
    ("/generate", sp(stop_regex="(.|.)*Q"), "stop_regex is not supported"),
    ("/generate", sp(stop_regex=["([a-z ]+)*Q"]), "stop_regex is not supported"),
    ("/generate", sp(stop="x" * 257), "stop: at most 16 strings of at most 256 characters"),
    ("/generate", sp(stop=["a"] * 17), "stop: at most 16 strings"),
    ("/generate", sp(stop=[5]), "stop must be a string or a list of strings"),
    ("/generate", b'{"input_ids": [5], "sampling_params": {"stop": ["\\ud800"]}}', "lone surrogate"),
    ("/v1/completions", {"prompt": "ab", "stop": "\ud800"}, "lone surrogate"),
    ("/generate", sp(stop_token_ids=list(range(1025))), "at most 1024 token ids"),
    ("/generate", sp(json_schema={"type": "object"}), "json_schema must be a string"),
    ("/generate", sp(regex="a+", ebnf="root ::= 'a'"), "only one of json_schema, regex, ebnf, structural_tag"),
    ("/generate", sp(beam_width=4), "beam_width > 1"),
    ("/generate", sp(watermark={"key": 1}), "watermark is not supported"),
    ("/generate", b'{"input_ids": [5], "sampling_params": ' + b'[' * 100000 + b']' * 100000 + b'}',
     "not valid JSON"),
])
def test_client_errors_are_400_with_a_message_and_reach_no_role(path, body, match):
    async def go():
        async with fu.FakeCluster() as cl:
            return await _post(cl, path, body), cl

    (status, text), cl = run(go())
    assert status == 400, text
    assert match in text
    assert not (cl.prefill.bodies or cl.relay.bodies or cl.main.bodies)


def test_a_null_max_new_tokens_takes_the_default():
    async def go():
        async with fu.FakeCluster() as cl:
            return await _post(cl, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": None}},
                               limits=ModelLimits(vocab_size=1024, context_len=4096)), cl

    (status, text), cl = run(go())
    assert status == 200 and cl.main.bodies[0]["sampling_params"]["max_new_tokens"] == 128


def test_an_oversized_body_is_413_with_a_message():
    async def go():
        async with fu.FakeCluster() as cl:
            return await _post(cl, "/generate", {"input_ids": [5] * 1000}, max_body_bytes=1000)

    status, text = run(go())
    assert status == 413 and "over the router's limit of 1000 bytes" in text


def _no_url(text: str, cl) -> None:
    for s in cl.servers:
        assert f":{s.port}" not in text, text
    assert "127.0.0.1" not in text, text


@pytest.mark.parametrize("where", ["main", "prefill"])
def test_an_upstream_4xx_stays_a_4xx_without_the_upstream_url(where):
    async def go():
        async with fu.FakeCluster() as cl:
            getattr(cl, where).behaviour = fu.status(400, "max_new_tokens must be at least 0")
            if where == "prefill":
                cl.main.behaviour = fu.hang()  # MD waits for KV that never comes, as it would
            return await _post(cl, "/generate", GOOD), cl

    (status, text), cl = run(go())
    assert status == 400 and "max_new_tokens must be at least 0" in text and where in text
    _no_url(text, cl)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("error", [
    {"error": {"message": "Invalid regex", "type": "invalid_request_error", "code": 400}},
    {"abort": {"type": "abort", "message": "prompt too long", "status_code": 400}},
])
def test_an_error_sglang_reports_inside_a_200_stream_keeps_its_status(stream, error):
    if "abort" in error:
        behaviour = fu.stream_then([fu.chunk([], error["abort"], False)])
    else:
        behaviour = fu.stream_then([], then="error", error=error["error"])

    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = behaviour
            return await _post(cl, "/generate", {**GOOD, "stream": stream}), cl

    (status, text), cl = run(go())
    assert status == 400, text
    assert ("Invalid regex" if "error" in error else "prompt too long") in text
    _no_url(text, cl)


def test_an_unreachable_role_is_502_without_its_address():
    async def go():
        async with fu.FakeCluster() as cl:
            await cl.servers[2].close()  # MD is gone
            return await _post(cl, "/generate", GOOD), cl

    (status, text), cl = run(go())
    assert status == 502 and "main" in text
    _no_url(text, cl)


def test_canonical_logit_bias_keys_reach_every_role_as_sent():
    bias = {"0": 1, "7": -1.5, "1023": 100}

    async def go():
        async with fu.FakeCluster() as cl:
            status, text = await _post(cl, "/generate", {"input_ids": [5], "sampling_params": {
                "max_new_tokens": 2, "logit_bias": bias}})
            return status, text, cl

    status, text, cl = run(go())
    assert status == 200, text
    assert [b["sampling_params"]["logit_bias"] for b in cl.prefill.bodies + cl.main.bodies] == [bias, bias]
