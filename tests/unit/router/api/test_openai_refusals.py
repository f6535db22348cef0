"""What the router refuses rather than echo without bound or drop silently (issue 31): the client's
`model` (echoed in every chunk) is bounded, `stream_options` must be an object (a 400 before any stream,
not a stream ended without [DONE]), and logprobs, top_logprobs and lora_path are a 400 naming the key
until the router implements them (admission.NOT_YET)."""

from __future__ import annotations

import asyncio

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import BadRequest, ModelLimits
from sglang_pdd.router.api.prepare import Preparer

PREP = Preparer(fu.CharTokenizer(), ModelLimits(), 4, workers=1)
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
BODIES = {"chat": CHAT, "completions": {"prompt": "hi"}, "generate": {"text": "hi"}}


def prepare(kind: str, **keys):
    import json
    return PREP.prepare(kind, json.dumps({**BODIES[kind], **keys}).encode())


@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("model", ["m" * 257, 5, ["m"], {"a": 1}])
def test_model_must_be_a_short_string(kind, model):
    with pytest.raises(BadRequest, match="model"):
        prepare(kind, model=model)


@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("opts, words", [(5, "stream_options"), ([], "stream_options"), ("x", "stream_options"),
                                         ({"include_usage": "yes"}, "include_usage")])
def test_stream_options_must_be_an_object(kind, opts, words):
    with pytest.raises(BadRequest, match=words):
        prepare(kind, stream=True, stream_options=opts)


@pytest.mark.parametrize("kind", ["chat", "completions", "generate"])
@pytest.mark.parametrize("key, value", [("logprobs", True), ("logprobs", 2), ("top_logprobs", 3),
                                        ("lora_path", "adapter"), ("lora_path", "")])
def test_not_yet_supported_keys_are_a_400_naming_them(kind, key, value):
    with pytest.raises(BadRequest, match=key):
        prepare(kind, **{key: value})


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_what_asks_for_nothing_passes(kind):
    p = prepare(kind, model="m" * 256, stream=True, stream_options={"include_usage": True}, logprobs=False,
                top_logprobs=0, lora_path=None)
    assert p.ids and prepare(kind, stream_options=None, logprobs=None).ids


def test_stream_options_not_an_object_is_a_400_over_http_not_a_cut_stream():
    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl) as c:
                r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": 5})
                return r.status, await r.json()
    status, body = asyncio.run(go())
    assert status == 400 and "stream_options" in body["error"]["message"]
