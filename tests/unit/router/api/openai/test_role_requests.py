"""What the roles are asked for a chat request is what sglang's own server would ask its scheduler
(issue 47): for each request, the body every role's copy gets through the router (P, RLD and MD over
fake roles, P->RLD->MD) is compared field by field with sglang's own conversion of the same request
(`OpenAIServingChat._convert_to_internal_request`, which `sglang_server.convert` calls), both read as
sglang's HTTP server reads a `/generate` body (`GenerateReqInput`, normalized). The sampling parameters
are compared key by key. The only differences allowed are the router's own keys and those named, with
the reason, below."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
DEFAULT_MAX_TOKENS = 128  # the router's --default-max-tokens in `fu.router_client`'s RouterApp

REQUESTS = {
    "plain": NO_THINKING,
    "tools, tool_choice required": {"tools": TOOLS, "tool_choice": "required", **NO_THINKING},
    "response_format json_schema": {"response_format": SCHEMA, **NO_THINKING},
    # a reasoning model with a response format: the grammar starts after the thinking (require_reasoning)
    "reasoning with response_format": {"response_format": SCHEMA, "chat_template_kwargs": {"enable_thinking": True}},
    "logprobs": {"logprobs": True, "top_logprobs": 2, "max_tokens": 8, **NO_THINKING},
    "stop strings, seed, temperature": {"stop": ["xx", "yy"], "seed": 3, "temperature": 0.5, "top_p": 0.9,
                                        "max_completion_tokens": 16, **NO_THINKING},
}

# Top-level fields the router sets itself for every role's copy, and why.
ROUTER_OWN = {
    "rid": "the router names each role's copy (pdd-<room> and the role's suffix)",
    "bootstrap_host": "the router's room plan (protocol.room_plan): P's bootstrap server",
    "bootstrap_port": "the router's room plan",
    "bootstrap_room": "the router's room plan: each role's room",
    "stream": "the router streams RLD's and MD's copies and reads P's answer whole; the client's stream is its own",
}


def same_meaning(name: str, ours, theirs) -> bool:
    """Fields whose values differ in form only (`ours`, `theirs`: the normalized requests):
    modalities, None and []: no multimodal input (sglang's conversion fills [] for a text prompt);
    return_text_in_logprobs: read only with return_logprob, and the router asks it with logprobs."""
    if name == "modalities":
        return not ours.modalities and not theirs.modalities
    if name == "return_text_in_logprobs":
        return not ours.return_logprob
    return False


@pytest.fixture(scope="module")
def layer(tiny_model):
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI

    return SglangOpenAI(OpenAIConfig(tiny_model, "tiny", tool_call_parser="qwen25", reasoning_parser="qwen3"))


def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}], **kw}


def role_bodies(layer, body: dict) -> dict[str, dict]:
    """Each role's body for `body` sent to a router over fake roles (P->RLD->MD)."""
    async def go():
        async with fu.FakeCluster() as cl:
            limits = ModelLimits(vocab_size=len(layer.tokenizer), context_len=4096)
            async with fu.router_client(cl, pipeline="relay", tokenizer=layer.tokenizer, limits=limits,
                                        openai=layer) as c:
                r = await c.post("/v1/chat/completions", json=body)
                await r.read()
                assert r.status == 200, await r.text()
            return {role.role: role.bodies[0] for role in (cl.prefill, cl.relay, cl.main)}
    return asyncio.run(go())


def normalized(req):
    from sglang.srt.managers.io_struct import GenerateReqInput

    if isinstance(req, dict):
        req = GenerateReqInput(**req)  # an unknown key is a TypeError, as on sglang's server
    req = copy.deepcopy(req)
    req.normalize_batch_and_arguments()
    return req


def sglang_defaults() -> dict:
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    return {f.name: f.default for f in msgspec.structs.fields(SamplingParams)}


def sampling_differences(ours: dict, sglangs: dict, client: dict) -> dict:
    """Key -> (ours, sglang's) where they differ, after the router's own key (custom_params.pdd) and
    sglang's None values (its SamplingParams' defaults, so the router drops them) are set aside."""
    ours = copy.deepcopy(ours)
    custom = ours.get("custom_params") or {}
    custom.pop("pdd", None)
    if not custom:
        ours.pop("custom_params", None)
    defaults = sglang_defaults()
    nones = {k for k, v in sglangs.items() if v is None}
    # dropping a None means sglang's default, which is None for all but max_new_tokens (below)
    assert all(defaults[k] is None for k in nones - {"max_new_tokens"}), nones
    sglangs = {k: v for k, v in sglangs.items() if v is not None}
    diff = {k: (ours.get(k), sglangs.get(k)) for k in ours.keys() | sglangs.keys() if ours.get(k) != sglangs.get(k)}
    if "max_new_tokens" in diff and not any(k in client for k in ("max_tokens", "max_completion_tokens")):
        # sglang's None is "up to the context"; the router bounds every request by --default-max-tokens
        # (its pipeline choice and deadlines need a length)
        assert diff.pop("max_new_tokens") == (DEFAULT_MAX_TOKENS, None)
    return diff


@pytest.mark.parametrize("name", list(REQUESTS))
def test_every_role_gets_what_sglangs_chat_layer_asks_for(layer, name):
    from sglang_pdd.router.api.openai.sglang_server import convert

    client = chat(**REQUESTS[name])
    sglang_req, _ = convert(layer.chat_for_thread(), copy.deepcopy(client))
    theirs = normalized(sglang_req)
    bodies = role_bodies(layer, client)
    assert set(bodies) == {"prefill", "relay", "main"}
    for role, body in bodies.items():
        ours = normalized(body)
        assert list(ours.input_ids) == list(theirs.input_ids), role
        assert sampling_differences(body["sampling_params"], sglang_req.sampling_params, client) == {}, role
        if role in ("prefill", "main"):  # the router's PDD parameters: P's main room, MD's relay
            assert body["sampling_params"]["custom_params"]["pdd"]
        for f in dataclasses.fields(ours):
            a, b = getattr(ours, f.name), getattr(theirs, f.name)
            if f.name in ("input_ids", "sampling_params") or f.name in ROUTER_OWN or a == b:
                continue
            assert same_meaning(f.name, ours, theirs), f"{role}: {f.name} is {a!r}, sglang's server asks {b!r}"


def test_the_reasoning_request_is_one_whose_grammar_waits_for_the_thinking(layer):
    """The case the comparison above is for: sglang sets require_reasoning outside the sampling
    parameters, and a role without it would constrain the thinking by the response format."""
    from sglang_pdd.router.api.openai.sglang_server import convert

    client = chat(**REQUESTS["reasoning with response_format"])
    sglang_req, _ = convert(layer.chat_for_thread(), copy.deepcopy(client))
    assert sglang_req.require_reasoning and json.loads(sglang_req.sampling_params["json_schema"])
    assert all(b.get("require_reasoning") is True for b in role_bodies(layer, client).values())
