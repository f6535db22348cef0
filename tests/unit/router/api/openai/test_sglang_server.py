"""The router's chat endpoint through sglang's own OpenAI layer (`router.api.openai.sglang_server`), on the tiny
model's real tokenizer and chat template (Qwen2.5 tool format), over a scripted stitched stream: sglang
converts the request (tools rendered, `tool_choice: required` constrained), sglang's parser turns the
stream back into `tool_calls` (whole and streamed), logprobs with their top rows come out in OpenAI's
shape, a failure after the first token ends the stream with sglang's error chunk and `[DONE]`, one
before it reaches the router as the failure it is. And the builtin layer refuses what it cannot serve."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.openai import feed as openai_feed
from sglang_pdd.router.api.admission import BadRequest, ModelLimits
from sglang_pdd.router.request.dispatch import Outcome, RequestFailed
from sglang_pdd.router.request.output_view import OutputView
from sglang_pdd.router.api.prepare import Preparer
from sglang_pdd.router.request.stitch import Delta

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def layer(tiny_model):
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI

    return SglangOpenAI(OpenAIConfig(tiny_model, "tiny", tool_call_parser="qwen25", reasoning_parser="qwen3"))


@pytest.fixture(scope="module")
def prep(layer):
    return Preparer(layer.tokenizer, ModelLimits(vocab_size=len(layer.tokenizer), context_len=4096), 64, workers=1,
                    openai=layer)


def body(**kw) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}],
                       "chat_template_kwargs": {"enable_thinking": False}, **kw}).encode()


def run(layer, prepared, text: str, fail_after: int | None = None, logprobs: bool = False):
    """sglang's answer to `prepared` over a stream of `text`'s tokens (one per delta); `fail_after`:
    the stream fails after that many tokens."""
    tok = layer.tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    outcome = Outcome(md_hit=5)
    outcome.live_logprobs = [(-0.25, t, tok.decode([t]), [(-0.25, t, tok.decode([t]))]) for t in ids]

    async def rest():
        for i, t in enumerate(ids[1:], 1):
            if fail_after is not None and i >= fail_after:
                raise RequestFailed("main: gone", status=502)
            yield Delta([t], tok.decode([t]), None)
        yield Delta([], "", {"type": "stop", "matched": tok.eos_token_id})

    adapted, req = prepared.chat
    state = openai_feed.FeedState()
    adapted.pdd_contents = openai_feed.contents(rest(), Delta([ids[0]], tok.decode([ids[0]]), None), "chatcmpl-t",
                                                len(prepared.ids), [], outcome, logprobs, not req.stream, state)

    async def go():
        if req.stream:
            return [c async for c in layer.chat._generate_chat_stream(adapted, req, None)]
        return json.loads((await layer.chat._handle_non_streaming_request(adapted, req, None)).model_dump_json())
    return asyncio.run(go()), state


def test_tool_choice_required_is_constrained_as_sglang_constrains_it(prep):
    p = prep.prepare("chat", body(tools=TOOLS, tool_choice="required"))
    tag = json.loads(p.sampling_params["structural_tag"])
    assert tag["triggers"] == ["<tool_call>"] and tag["at_least_one"]
    # the tools are in the prompt, rendered by the model's template
    assert "get_weather" in prep.tok.decode(p.ids)
    plain = prep.prepare("chat", body())
    assert "structural_tag" not in plain.sampling_params and len(plain.ids) < len(p.ids)


def test_the_tool_call_comes_back_whole_and_streamed(layer, prep):
    whole, _ = run(layer, prep.prepare("chat", body(tools=TOOLS)), CALL)
    ch = whole["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and not ch["message"]["content"]
    (call,) = ch["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 5  # what MD held (the router's view)
    chunks, _ = run(layer, prep.prepare("chat", body(tools=TOOLS, stream=True)), CALL)
    assert chunks[-1] == "data: [DONE]\n\n"
    events = [json.loads(c[6:]) for c in chunks[:-1]]
    args = "".join(t["function"]["arguments"] or "" for e in events for ch in e["choices"]
                   for t in ch["delta"].get("tool_calls") or [])
    assert json.loads(args) == {"city": "Paris"}
    assert [ch["finish_reason"] for e in events for ch in e["choices"] if ch["finish_reason"]] == ["tool_calls"]


def test_logprobs_and_top_logprobs_in_openais_shape(layer, prep):
    got, _ = run(layer, prep.prepare("chat", body(logprobs=True, top_logprobs=1)), "hello there", logprobs=True)
    content = got["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == "hello there"
    assert all(c["logprob"] == -0.25 and [t["token"] for t in c["top_logprobs"]] == [c["token"]] for c in content)


@pytest.mark.parametrize("n", [21, 10**6, -1])
def test_top_logprobs_over_openais_bound_is_a_400(prep, n):
    """sglang sets no bound; each row rides with every token through the router's one event loop."""
    with pytest.raises(BadRequest, match="top_logprobs must be between 0 and 20"):
        prep.prepare("chat", body(logprobs=True, top_logprobs=n))


def test_twenty_top_logprobs_are_served(prep):
    assert prep.prepare("chat", body(logprobs=True, top_logprobs=20)).chat is not None


def test_a_failure_after_the_first_token_ends_the_stream_with_an_error_and_done(layer, prep):
    chunks, state = run(layer, prep.prepare("chat", body(stream=True)), "hello there my friend", fail_after=2)
    assert chunks[-1] == "data: [DONE]\n\n" and state.failed
    err = json.loads(chunks[-2][6:])
    assert err["error"]["code"] == 502 and "main: gone" in err["error"]["message"]
    with pytest.raises(RequestFailed):  # not streamed: the router answers with the failure's status
        run(layer, prep.prepare("chat", body()), "hello there my friend", fail_after=2)


def test_sglangs_own_refusals_are_a_400(prep):
    with pytest.raises(BadRequest, match="[Tt]ool choice"):
        prep.prepare("chat", body(tool_choice="required"))  # no tools to choose from
    with pytest.raises(BadRequest, match="messages"):
        prep.prepare("chat", json.dumps({"model": "tiny", "messages": "hi"}).encode())


def test_an_unknown_parser_is_refused_at_start_naming_the_flag(tiny_model):
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, check_config

    with pytest.raises(ValueError, match="--tool-call-parser"):
        check_config(OpenAIConfig(tiny_model, "tiny", tool_call_parser="nope"))
    with pytest.raises(ValueError, match="--reasoning-parser"):
        check_config(OpenAIConfig(tiny_model, "tiny", reasoning_parser="nope"))


def test_parser_flags_without_sglangs_layer_are_refused_naming_them(monkeypatch):
    from sglang_pdd.router.__main__ import openai_frontend

    args = types.SimpleNamespace(openai_frontend="builtin", tool_call_parser="qwen25", reasoning_parser=None,
                                 chat_template=None)
    with pytest.raises(SystemExit, match="--tool-call-parser"):
        openai_frontend(args, "tiny")
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="--openai-frontend sglang"):
        openai_frontend(types.SimpleNamespace(openai_frontend="sglang", tool_call_parser=None, reasoning_parser=None,
                                              chat_template=None), "tiny")


def test_top_logprob_rows_ride_with_their_tokens_through_the_output_view():
    view = OutputView()
    ids, lps = view.push({"output_ids": [5, 6], "meta_info": {
        "output_token_logprobs": [[-1.0, 5, "a"], [-2.0, 6, "b"]],
        "output_top_logprobs": [[[-1.0, 5, "a"]], [[-1.5, 7, "c"]]]}})
    assert ids == [5, 6] and lps[1] == (-2.0, 6, "b", [[-1.5, 7, "c"]])
    live = openai_feed.LiveLogprobs()
    live.grow(lps, 1)  # the client has one token so far
    assert live.meta(final=False)["output_token_logprobs_length"] == 1
    live.grow(lps, 2)
    meta = live.meta(final=True)
    assert meta["output_token_logprobs"] == [(-1.0, 5, "a"), (-2.0, 6, "b")]
    assert meta["output_top_logprobs"] == [[[-1.0, 5, "a"]], [[-1.5, 7, "c"]]]
    assert meta["output_token_logprobs"] is not live.tokens  # the last chunk's lists are copies


def test_streamed_chunks_share_the_live_lists_and_the_last_gets_copies():
    """Per delta the feed adds only the new tokens' entries (O(1) per token, issue 47), not the whole
    list again; sglang's layer slices an intermediate chunk's lists at its length at once."""
    async def go():
        lps = [(-0.5 * i, i, str(i), [[-0.1, i, str(i)]]) for i in range(1, 7)]
        outcome = Outcome(live_logprobs=lps)

        async def rest():
            for i in range(2, 7):
                yield Delta([i], str(i), {"type": "length", "length": 6} if i == 6 else None)

        chunks = []
        async for c in openai_feed.contents(rest(), Delta([1], "1", None), "r", 3, [], outcome, True, False,
                                            openai_feed.FeedState()):
            m = c["meta_info"]
            chunks.append((m["output_token_logprobs_length"], m["output_token_logprobs"], c["output_ids"]))
        return chunks

    chunks = asyncio.run(go())
    assert [n for n, _, _ in chunks] == [1, 2, 3, 4, 5, 6]
    live_lists = {id(lp) for _, lp, _ in chunks[:-1]}
    assert len(live_lists) == 1  # one list, grown in place
    final = chunks[-1]
    assert id(final[1]) not in live_lists and final[2] == [1, 2, 3, 4, 5, 6]
    assert final[1] == [(-0.5 * i, i, str(i)) for i in range(1, 7)]


@pytest.mark.parametrize("key, value", [("tools", TOOLS), ("tool_choice", "required"),
                                        ("response_format", {"type": "json_object"})])
def test_the_builtin_layer_refuses_what_it_would_drop(key, value):
    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl) as c:
                r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                               key: value})
                return r.status, await r.json(), len(cl.main.bodies)
    status, got, reached = asyncio.run(go())
    assert status == 400 and key in got["error"]["message"] and reached == 0
