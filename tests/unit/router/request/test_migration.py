"""Request migration (issue 18) over the router's HTTP front with fake roles that continue a prompt as
one fixed model would (output i of an L-token prompt is token(L + i)): a role that fails mid-stream
costs no request, the client's stream has no gap and no duplicate, and what may not migrate still
fails with a clear error. The fake roles: tests/unit/router/kit/fixed_model.py. After a stall:
migration/test_stalls.py; the rules alone: migration/test_rules.py; peer health: peers/test_health.py."""

import asyncio
import json

import pytest
from aiohttp import web

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.protocol.reply import ReplyMeta
from tests.unit.router.kit.fixed_model import (PROMPT, final_reply, generate_body, migrations_by_cause, model,
                                               post_generate, reference, run)


def prefill_failing(times: int = 1):
    calls = {"n": 0}

    async def answer(request, body):
        calls["n"] += 1
        if calls["n"] <= times:
            return web.json_response({"error": {"message": "KV transfer failed"}}, status=503)
        return web.json_response({"text": "", "output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}})
    return answer


# -- end to end over fakes ------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_md_cut_mid_stream_on_p_md_goes_on_on_another_md(stream):
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=5), model()
            return await post_generate(cl, generate_body(12, stream)), cl

    (status, text, metrics, health), cl = run(go())
    assert status == 200, text
    out = final_reply(text, stream)
    assert out["output_ids"] == reference(12)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert ReplyMeta.of(out["meta_info"]).migrations == 1
    assert ReplyMeta.of(out["meta_info"]).migration_causes == ["broken"]
    resumed = cl.main2.bodies[0]
    assert resumed["input_ids"] == PROMPT + reference(5)
    assert resumed["sampling_params"]["max_new_tokens"] == 7
    assert len(cl.prefill.bodies) == 2  # P was asked again, for the longer prompt
    assert cl.main.aborts and cl.prefill.aborts  # the dead attempt's copies were let go
    assert migrations_by_cause(metrics) == {("broken", "completed"): 1}
    assert health[0] == 200  # one failure of a reachable MD does not eject it


def test_md_dead_after_the_handoff_goes_on_p_rld_md_with_another_md_and_logprobs():
    """--pipeline relay: the migration takes the pipeline any request would, P->RLD->MD on the other MD
    (RLD goes on at once while the new MD's KV lands; then a second handoff)."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.relay.behaviour = model(handoff_tokens=4)
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=6, eager=4, how="abort"), model(eager=4)
            return await post_generate(cl, generate_body(12, return_logprob=True), pipeline="relay"), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(12)
    pdd = ReplyMeta.of(out["meta_info"])
    assert pdd.handoff_tokens == 4 and pdd.migrations == 1
    assert [x[1] for x in out["meta_info"]["output_token_logprobs"]] == reference(12)
    assert [b["input_ids"] for b in cl.relay.bodies] == [PROMPT, PROMPT + reference(6)]  # the relay went on
    assert cl.main2.bodies[0]["input_ids"] == PROMPT + reference(6)
    assert "pdd" in cl.main2.bodies[0]["sampling_params"]["custom_params"]  # MD 2 took over from the relay
    assert pdd.migration_pipelines == ["P->RLD->MD"]
    assert migrations_by_cause(metrics) == {("abort", "completed"): 1}


def test_md_dead_after_the_handoff_on_pipeline_direct_goes_on_p_md():
    """The control: where the policy says P->MD (--pipeline direct), the migration does too."""
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=6, how="abort"), model()
            return await post_generate(cl, generate_body(12, return_logprob=True), pipeline="direct"), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(12) and ReplyMeta.of(out["meta_info"]).migrations == 1
    assert [x[1] for x in out["meta_info"]["output_token_logprobs"]] == reference(12)
    assert cl.main2.bodies[0]["input_ids"] == PROMPT + reference(6) and not cl.relay.bodies
    assert "custom_params" not in cl.main2.bodies[0]["sampling_params"]  # P->MD: no relay
    assert ReplyMeta.of(out["meta_info"]).migration_pipelines == ["P->MD"]


def test_rld_dead_before_the_handoff_goes_on_p_md_on_the_same_md():
    """MD held the KV of the prompt (its radix cache makes the new transfer a few pages)."""
    async def go():
        async with fu.FakeCluster() as cl:
            cl.relay.behaviour = model(fail_at=3, handoff_tokens=8)
            cl.main.behaviour = model(eager=8)
            return await post_generate(cl, generate_body(12), pipeline="relay"), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(12)
    assert ReplyMeta.of(out["meta_info"]).migrations == 1
    assert [b["input_ids"] for b in cl.main.bodies] == [PROMPT, PROMPT + reference(3)]
    assert len(cl.relay.bodies) == 1 and cl.main.aborts  # MD's waiting copy was cleaned up
    assert migrations_by_cause(metrics) == {("broken", "completed"): 1}


def test_with_no_md_in_service_rld_finishes_alone():
    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = model(fail_at=2, eager=0)  # P->MD: MD dies after 2 tokens, the only MD
            cl.relay.behaviour = model()  # P->RLD: no handoff
            return await post_generate(cl, generate_body(10), pipeline="direct"), cl

    (status, text, _, _), cl = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(10)
    assert cl.relay.bodies[0]["input_ids"] == PROMPT + reference(2)


def test_a_failing_prefill_is_retried():
    async def go():
        async with fu.FakeCluster() as cl:
            cl.prefill.behaviour, cl.main.behaviour = prefill_failing(), model()
            return await post_generate(cl, generate_body(6)), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200, text
    assert json.loads(text)["output_ids"] == reference(6)
    assert migrations_by_cause(metrics) == {("5xx", "completed"): 1}


def test_md_failing_before_the_handoff_leaves_rld_to_finish():
    """MD's failure reaches MD's queue only: RLD (its handoff target gone, it hands off to nobody) ends
    the request by itself, and nothing migrates."""
    async def go():
        async with fu.FakeCluster() as cl:
            cl.relay.behaviour, cl.main.behaviour = model(), model(fail_at=0, how="503")
            return await post_generate(cl, generate_body(9), pipeline="relay"), cl

    (status, text, metrics, _), cl = run(go())
    assert status == 200, text
    out = json.loads(text)
    assert out["output_ids"] == reference(9) and ReplyMeta.of(out["meta_info"]).migrations == 0
    assert migrations_by_cause(metrics) == {}


def test_a_failure_of_prefill_after_rld_started_does_not_cut_rld():
    """P's failure (MD's transfer) after RLD streams: RLD has its KV and goes on to the end."""
    async def go():
        async with fu.FakeCluster() as cl:
            async def late_failure(request, body):
                await asyncio.sleep(0.3)
                return web.json_response({"error": {"message": "transfer to main failed"}}, status=503)

            async def slow(request, body):
                resp = await fu.start_stream(request)
                ids = reference(8)
                for c in range(1, 9):
                    await resp.write(fu._sse(fu.chunk(ids[:c], {"type": "length"} if c == 8 else None, False)))
                    await asyncio.sleep(0.1)
                await resp.write(b"data: [DONE]\n\n")
                return resp
            cl.prefill.behaviour, cl.relay.behaviour, cl.main.behaviour = late_failure, slow, fu.hang()
            return await post_generate(cl, generate_body(8), pipeline="relay", limit=0), cl

    (status, text, _, _), cl = run(go())
    assert status == 200, text
    assert json.loads(text)["output_ids"] == reference(8)


@pytest.mark.parametrize("stream", [False, True])
def test_with_migration_limit_0_the_client_gets_the_error(stream):
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour = model(fail_at=5)
            return await post_generate(cl, generate_body(12, stream), limit=0), cl

    (status, text, metrics, _), cl = run(go())
    if stream:
        assert status == 200 and '"error"' in text and "ended without a finish reason" in text
    else:
        assert status == 502 and "ended without a finish reason" in text
    assert not cl.main2.bodies and cl.main.aborts
    assert migrations_by_cause(metrics) == {("broken", "not-migrated"): 1}


def test_a_second_failure_past_the_limit_fails_the_request():
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=3), model(fail_at=2)
            return await post_generate(cl, generate_body(12), limit=1), cl

    (status, text, metrics, _), _ = run(go())
    assert status == 502
    assert migrations_by_cause(metrics) == {("broken", "failed"): 1, ("broken", "not-migrated"): 1}


def test_a_clients_error_is_never_migrated():
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour = model(fail_at=2, how="error400")
            return await post_generate(cl, generate_body(12)), cl

    (status, text, _, _), cl = run(go())
    assert status == 400 and "bad logit_bias" in text
    assert not cl.main2.bodies


def test_all_tokens_sent_before_the_cut_end_at_their_length():
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour = model(fail_at=6)
            return await post_generate(cl, generate_body(6)), cl

    (status, text, _, _), cl = run(go())
    out = json.loads(text)
    assert status == 200 and out["output_ids"] == reference(6)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert ReplyMeta.of(out["meta_info"]).migrations == 0
    assert not cl.main2.bodies  # nothing was left to ask for


def test_an_unreachable_md_is_ejected_and_health_says_so():
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main2.behaviour = model()
            await cl.servers[2].close()  # MD 1 is gone
            async with fu.router_client(cl, migration_limit=1) as c:
                r = await c.post("/generate", json=generate_body(5))
                first = (r.status, await r.json())
                h = await c.get("/health")
                health = (h.status, await h.json())
                r = await c.post("/generate", json=generate_body(5))  # goes straight to MD 2
                second = r.status
                await cl.servers[3].close()
                await c.post("/generate", json=generate_body(5))
                h = await c.get("/health")
                down = (h.status, await h.json())
            return first, health, second, down, cl

    first, health, second, down, cl = run(go())
    assert first[0] == 200 and first[1]["output_ids"] == reference(5)
    assert ReplyMeta.of(first[1]["meta_info"]).migration_causes == ["unreachable"]
    assert health[0] == 200 and health[1]["out"] == {"main": [cl.url(2)]} and health[1]["down"] == []
    assert second == 200 and len(cl.main2.bodies) == 2
    assert down[0] == 503 and down[1]["down"] == ["main"]


def test_with_every_relay_out_of_service_a_relayed_request_goes_p_md_at_once():
    """The negative control is the first request: it finds the relay dead and spends its migration;
    the second, with the relay known to be out, goes P->MD and keeps its migration for a real failure."""
    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = model()
            await cl.servers[1].close()  # the only RLD is gone
            async with fu.router_client(cl, pipeline="relay", migration_limit=1) as c:
                outs = []
                for _ in range(2):
                    r = await c.post("/generate", json=generate_body(5))
                    outs.append((r.status, await r.json()))
            return outs

    (s1, o1), (s2, o2) = run(go())
    assert s1 == 200 and o1["output_ids"] == reference(5)
    assert ReplyMeta.of(o1["meta_info"]).migration_causes == ["unreachable"]
    pdd = ReplyMeta.of(o2["meta_info"])
    assert s2 == 200 and o2["output_ids"] == reference(5) and pdd.migrations == 0
    assert pdd.pipeline == "P->MD" and "no relay in service" in pdd.reason


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_path_migrates_with_one_seamless_text(stream):
    async def go():
        async with fu.FakeCluster(main2=fu.FakeRole("main")) as cl:
            cl.main.behaviour, cl.main2.behaviour = model(fail_at=5), model()
            async with fu.router_client(cl, migration_limit=1) as c:
                r = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "stream": stream})
                return r.status, await r.text()

    status, text = run(go())
    assert status == 200, text
    if stream:
        chunks = [json.loads(x[5:]) for x in text.split("\n") if x.startswith("data:") and "[DONE]" not in x]
        assert all("error" not in c for c in chunks), chunks
        got = "".join(c["choices"][0]["text"] for c in chunks)
        reason = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = json.loads(text)["choices"][0]
        got, reason = choice["text"], choice["finish_reason"]
    assert got == "".join(map(chr, reference(12))) and reason == "length"
