"""A migrated stream's edges (issue 31), over the router's HTTP front with the fake roles of
tests/unit/router/kit/fixed_model.py: a second failure that leaves nothing to generate ends the stream without
sending anything twice (it re-sent the last `offset` tokens, or raised a 500), and a stop string that
straddles the migration ends the request where it completes (sglang on the resumed server only sees
its own output)."""

import json

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.protocol.handoff_finish import HandoffFinish
from sglang_pdd.protocol.reply import ReplyMeta
from tests.unit.router.kit.dispatch_client import config, router
from tests.unit.router.kit.fixed_model import PROMPT, final_reply, generate_body, model, reference, run


async def _post(cl, body, path="/generate", **cfg):
    async with router(cl, config(**cfg)) as (c, d):
        r = await c.post(path, json=body)
        return r.status, await r.text()


@pytest.mark.parametrize("stream", [False, True])
def test_a_second_failure_with_every_token_sent_ends_without_a_duplicate(stream):
    """MD 1 dies after 3 of 5 tokens, MD 2 sends the last 2 and dies before its finish: nothing is left
    to generate, and the client's stream ends at its length with each token once."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=3), model(fail_at=2)
            return await _post(cl, generate_body(5, stream), migration_limit=2)

    status, text = run(go())
    assert status == 200, text
    out = final_reply(text, stream)
    assert out["output_ids"] == reference(5)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert ReplyMeta.of(out["meta_info"]).migrations == 1


def test_a_relayed_migration_whose_relay_dies_after_the_last_token_ends_cleanly():
    """The second copy goes P->RLD->MD; its relay streams the last tokens and dies before its handoff:
    the end of the stream comes from the relay's side of the stitcher (it was a 500)."""
    calls = {"n": 0}

    async def relay(request, body):
        calls["n"] += 1
        n = body["sampling_params"]["max_new_tokens"]
        ids = [fu.token(len(body["input_ids"]) + i) for i in range(n)]
        resp = await fu.start_stream(request)
        if calls["n"] == 1:  # the first copy hands off after 2 tokens
            for c in (1, 2):
                end = HandoffFinish(handoff_tokens=2, mode="one-shot").to_finish() if c == 2 else None
                await resp.write(fu._sse(fu.chunk(ids[:c], end, False)))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        for c in range(1, n + 1):  # the migrated copy: every token it was asked for, then the stream is cut
            await resp.write(fu._sse(fu.chunk(ids[:c], None, False)))
        return resp

    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.relay.behaviour = relay
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=3, eager=2, how="abort"), fu.hang()
            return await _post(cl, generate_body(5), pipeline="relay", migration_limit=2)

    status, text = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(5)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert ReplyMeta.of(out["meta_info"]).migration_pipelines == ["P->RLD->MD"]


# -- a stop string across the migration ---------------------------------------------------------
# The fake model's output after PROMPT is "defghijk...": MD 1 dies after "def".
@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_straddling_the_migration_ends_the_request(stream):
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour = model(fail_at=3)
            cl.main2.behaviour = model(fail_at=4, how="hang")  # still generating when the stop completes
            body = {**generate_body(12, stream), "sampling_params": {"max_new_tokens": 12, "stop": ["xyz", "fgh"]}}
            return await _post(cl, body), cl

    (status, text), cl = run(go())
    assert status == 200, text
    out = final_reply(text, stream)
    assert out["output_ids"] == reference(5)  # d e f | g h: the stop completes at h
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "fgh"}
    assert ReplyMeta.of(out["meta_info"]).migrations == 1
    assert cl.main2.aborts  # the resumed copy, still generating, was let go


def test_a_stop_completed_inside_a_chunk_of_several_tokens_cuts_the_chunk_and_its_logprobs():
    """MD 2 streams 4 tokens a chunk ("abcd", a fake that ignores the prompt): "fa" completes at its
    first token, and the rest of the chunk never reaches the client."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main", every=4)) as cl:
            cl.main.behaviour = model(fail_at=3)
            body = {**generate_body(12), "return_logprob": True, "sampling_params": {"max_new_tokens": 12, "stop": "fa"}}
            return await _post(cl, body)

    status, text = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(3) + [fu.token(0)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "fa"}
    assert len(out["meta_info"]["output_token_logprobs"]) == 4


def test_the_control_a_stop_string_wholly_before_the_boundary_is_not_acted_on():
    """"de" lies wholly in the client's past ("def"): the stream goes on to its length."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=3), model()
            return await _post(cl, {**generate_body(8), "sampling_params": {"max_new_tokens": 8, "stop": ["de"]}})

    status, text = run(go())
    out = json.loads(text)
    assert status == 200 and out["output_ids"] == reference(8)
    assert out["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_path_cuts_its_text_at_a_stop_straddling_the_migration(stream):
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=3), model()
            return await _post(cl, {"prompt": PROMPT, "max_tokens": 12, "stop": ["fg"], "stream": stream},
                               path="/v1/completions")

    status, text = run(go())
    assert status == 200, text
    if stream:
        chunks = [json.loads(x[5:]) for x in text.split("\n") if x.startswith("data:") and "[DONE]" not in x]
        got = "".join(c["choices"][0]["text"] for c in chunks)
        reason = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = json.loads(text)["choices"][0]
        got, reason = choice["text"], choice["finish_reason"]
    assert (got, reason) == ("de", "stop")
