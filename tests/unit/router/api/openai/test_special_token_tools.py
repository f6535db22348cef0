"""Tool-call markers that are special tokens (Mistral's `[TOOL_CALLS]`, harmony's channels) reach sglang's
tool parser through the router (issue 47): the router decodes each request with its own
`skip_special_tokens` and `spaces_between_special_tokens`, which sglang's chat layer turns off when tools
are present, and drops the stop token that ended it, as sglang's detokenizer does (`request_text`). On
a copy of the tiny model's tokenizer whose `<tool_call>` markers are special tokens, over fake roles
that stream the call, through the whole router (admission, dispatcher, stitcher, sglang's chat layer)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.request import request_text

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MARKERS = ("<tool_call>", "</tool_call>")


@pytest.fixture(scope="module")
def special_markers(tiny_model, tmp_path_factory) -> str:
    """The tiny model's tokenizer, config and template, with its tool-call markers special tokens (as
    Mistral's are): skipped when a request skips special tokens."""
    out = tmp_path_factory.mktemp("special-markers")
    for name in ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny_model, name), out / name)
    with open(os.path.join(tiny_model, "tokenizer.json")) as f:
        tok = json.load(f)
    marked = [t for t in tok["added_tokens"] if t["content"] in MARKERS]
    assert len(marked) == 2
    for t in marked:
        t["special"] = True
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return str(out)


@pytest.fixture(scope="module")
def layer(special_markers):
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI

    layer = SglangOpenAI(OpenAIConfig(special_markers, "tiny", tool_call_parser="qwen25"))
    tok = layer.tokenizer
    assert tok.decode(tok.encode(CALL, add_special_tokens=False), skip_special_tokens=True) == CALL[11:-12]
    return layer


def stream_ids(ids: list[int]):
    """MD's answer: `ids` one token per chunk (cumulative, as sglang streams), finishing on a matched stop
    token, the last."""
    async def answer(request, body):
        resp = await fu.start_stream(request)
        for n in range(1, len(ids) + 1):
            reason = {"type": "stop", "matched": ids[-1]} if n == len(ids) else None
            await resp.write(fu._sse(fu.chunk(ids[:n], reason, False, completion_tokens=n)))
        await resp.write(b"data: [DONE]\n\n")
        return resp
    return answer


def post(layer, path: str, body: dict, ids: list[int]):
    """(status, JSON answer or SSE chunks, MD's bodies) of `body` on a router over fake roles whose MD
    streams `ids`."""
    async def go():
        async with fu.FakeCluster(main=fu.FakeRole("main", behaviour=stream_ids(ids))) as cl:
            limits = ModelLimits(vocab_size=len(layer.tokenizer), context_len=4096)
            async with fu.router_client(cl, tokenizer=layer.tokenizer, limits=limits, openai=layer) as c:
                r = await c.post(path, json=body)
                got = await r.json() if not body.get("stream") else (await r.text()).split("\n\n")
                return r.status, got, cl.main.bodies
    return asyncio.run(go())


def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}], **kw}


def call_ids(layer) -> list[int]:
    tok = layer.tokenizer
    return tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]


def test_special_token_markers_reach_sglangs_tool_parser_whole_and_streamed(layer):
    status, got, bodies = post(layer, "/v1/chat/completions", chat(tools=TOOLS), call_ids(layer))
    assert status == 200 and bodies[0]["sampling_params"]["skip_special_tokens"] is False
    ch = got["choices"][0]
    (call,) = ch["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert ch["finish_reason"] == "tool_calls" and not ch["message"]["content"]  # no "</s>": the stop token is cut
    status, chunks, _ = post(layer, "/v1/chat/completions", chat(tools=TOOLS, stream=True), call_ids(layer))
    events = [json.loads(c[6:]) for c in chunks if c.startswith("data: {")]
    args = "".join(t["function"]["arguments"] or "" for e in events for ch in e["choices"]
                   for t in ch["delta"].get("tool_calls") or [])
    assert status == 200 and json.loads(args) == {"city": "Paris"}
    assert not "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"]).strip()


def test_negative_control_decoding_every_request_skipping_special_tokens_loses_the_call(layer, monkeypatch):
    """The router's old way (skip_special_tokens=True whatever the request): the markers vanish and the
    call comes back as plain content."""
    of = request_text.RequestText.of
    monkeypatch.setattr(request_text.RequestText, "of", classmethod(
        lambda cls, decode, sp, kept=frozenset(): of(decode, {**sp, "skip_special_tokens": True}, kept)))
    status, got, _ = post(layer, "/v1/chat/completions", chat(tools=TOOLS), call_ids(layer))
    msg = got["choices"][0]["message"]
    assert status == 200 and not msg.get("tool_calls") and '"get_weather"' in msg["content"]


@pytest.mark.parametrize("params, text", [
    ({}, CALL[11:-12]),  # sglang's default: special tokens skipped (the stop token with them)
    ({"skip_special_tokens": False}, CALL),  # kept, and the stop token that ended it cut
    ({"skip_special_tokens": False, "no_stop_trim": True}, CALL + "</s>"),
])
def test_generate_decodes_each_request_with_its_own_options(layer, params, text):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 64, **params}}
    status, got, bodies = post(layer, "/generate", body, call_ids(layer))
    assert status == 200 and got["text"] == text and got["output_ids"] == call_ids(layer)


def test_the_stop_tokens_a_tool_parser_keeps_are_sglangs(layer):
    from sglang_pdd.router.api.openai.sglang_server import GPT_OSS_CALL, kept_stop_ids

    assert layer.kept_stop_ids == frozenset()  # qwen25 closes a call with text, not a stop token
    assert kept_stop_ids("gpt-oss", layer.tokenizer) == {GPT_OSS_CALL}
