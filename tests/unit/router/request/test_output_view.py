"""A role copy's output, whether its server streams cumulatively or as deltas
(`--incremental-streaming-output`), and the router's answer either way (fake roles)."""

import asyncio
import json

import pytest

from sglang_pdd.router.request.output_view import OutputView
from sglang_pdd.lab.testing import fake_upstream as fu


def c(ids, n=None, lp=None):
    meta = {} if n is None else {"completion_tokens": n}
    if lp is not None:
        meta["output_token_logprobs"] = lp
    return {"output_ids": ids, "meta_info": meta}


def test_cumulative_chunks_replace_the_output():
    v = OutputView()
    assert v.push(c([1], 1, ["a"])) == ([1], ["a"])
    assert v.push(c([1, 2, 3], 3, ["a", "b", "c"])) == ([1, 2, 3], ["a", "b", "c"])
    assert v.incremental is None  # a count that matches the chunk: cumulative, nothing to decide
    assert v.push(c([1, 2, 3], 3)) == ([1, 2, 3], ["a", "b", "c"])  # a finish chunk without logprobs


def test_deltas_extend_the_output_from_the_first_chunk_the_count_tells_apart():
    v = OutputView()
    assert v.push(c([1, 2], 2, ["a", "b"])) == ([1, 2], ["a", "b"])  # the first: the same either way
    assert v.push(c([3], 3, ["c"])) == ([1, 2, 3], ["a", "b", "c"]) and v.incremental
    assert v.push(c([4, 5, 6], 6, ["d", "e", "f"]))[0] == [1, 2, 3, 4, 5, 6]  # coalesced deltas
    assert v.push(c([], 6)) == ([1, 2, 3, 4, 5, 6], ["a", "b", "c", "d", "e", "f"])  # a finish with no token


def test_without_a_count_chunks_are_taken_as_cumulative():
    v = OutputView()
    v.push(c([1, 2]))
    assert v.push(c([3])) == ([3], []) and v.incremental is None  # as the router always read them
    w = OutputView()
    w.push(c([1, 2], 2))
    assert w.push(c([1, 2, 3, 4], 9))[0] == [1, 2, 3, 4] and w.incremental is None  # a count that fits neither


def run(coro, guard_s: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, guard_s))


async def _answer(incremental: bool, pipeline: str, stream: bool, n: int, every: int):
    body = {"input_ids": [5, 6], "return_logprob": True, "stream": stream, "sampling_params": {"max_new_tokens": n}}
    async with fu.FakeCluster(relay=fu.FakeRole("relay", handoff_tokens=5, every=every, incremental=incremental),
                              main=fu.FakeRole("main", every=every, incremental=incremental)) as cl:
        async with fu.router_client(cl, pipeline=pipeline) as client:
            r = await client.post("/generate", json=body)
            text = await r.text()
    assert r.status == 200, text[:300]
    if not stream:
        return json.loads(text)
    lines = [json.loads(x[5:]) for x in text.split("\n") if x.startswith("data:") and "[DONE]" not in x]
    return {"chunks": [x["output_ids"] for x in lines], "last": lines[-1]}


@pytest.mark.parametrize("pipeline", ["direct", "relay"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_client_gets_the_same_answer_from_incremental_and_cumulative_roles(pipeline, stream):
    n, every = 23, 3
    inc = run(_answer(True, pipeline, stream, n, every))
    cum = run(_answer(False, pipeline, stream, n, every))
    assert inc == cum
    out = inc["last"] if stream else inc
    assert out["output_ids"] == [fu.token(i) for i in range(n)]
    if not stream:
        lps = out["meta_info"]["output_token_logprobs"]
        assert [x[1] for x in lps] == out["output_ids"]  # one per token, no gap, no repeat at the handoff
        assert lps[7][0] == pytest.approx(-0.123456789012345 - 7e-9)


def test_negative_control_a_router_that_reads_deltas_as_cumulative_fails(monkeypatch):
    """The fakes really stream deltas: without telling the modes apart the stitcher sees the stream go back."""
    from sglang_pdd.router.request import output_view

    monkeypatch.setattr(output_view.OutputView, "incremental", property(lambda self: False, lambda self, v: None),
                        raising=False)
    with pytest.raises(AssertionError, match="502"):
        run(_answer(True, "direct", False, 23, 3))
