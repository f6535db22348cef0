"""examples/clients: the OpenAI SDK scripts' functions against a real PDD router over fake roles. The
streamed text is what the roles produced, stitched across the handoff; every agent turn resends the
whole conversation (each prompt extends the previous one by the reply and the new tool output)."""

from __future__ import annotations

import importlib.util
import io
import os

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu

from .conftest import EXAMPLES
from .fake_router import running_router

openai = pytest.importorskip("openai")
HERE = os.path.join(EXAMPLES, "clients")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_clients_{name}", os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected(n: int) -> str:
    return "".join(chr(fu.token(i)) for i in range(n))  # the fakes' token i under CharTokenizer


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("pipeline", ["direct", "relay"])
def test_stream_chat_prints_the_stitched_stream(pipeline):
    mod = load("stream_chat")
    out = io.StringIO()
    with running_router(pipeline) as (url, cl):
        text = mod.stream_chat(client(url), "fake", [{"role": "user", "content": "hi"}], max_tokens=10, out=out)
    assert text == expected(10)
    assert out.getvalue() == expected(10) + "\n"
    (body,) = cl.main.bodies
    assert body["stream"] and body["sampling_params"]["max_new_tokens"] == 10
    if pipeline == "relay":
        (rld,) = cl.relay.bodies  # RLD streamed the first tokens, MD the rest
        assert rld["stream"]
    else:
        assert not cl.relay.bodies


def test_agent_loop_resends_the_growing_conversation():
    mod = load("agent_loop")
    turns, n = 4, 6
    with running_router("direct") as (url, cl):
        conv = mod.agent_loop(client(url), "fake", "fix it", turns=turns, max_tokens=n, tools=None, out=io.StringIO())
    assert [m["role"] for m in conv] == ["system", "user"] + ["assistant", "user"] * turns
    assert [m["content"] for m in conv[2::2]] == [expected(n)] * turns
    # what P received each turn: the whole conversation so far (CharTokenizer's template joins contents)
    prompts = ["".join(map(chr, b["input_ids"])) for b in cl.prefill.bodies]
    assert len(prompts) == turns
    for t, p in enumerate(prompts):
        assert p == "".join(m["content"] for m in conv[:2 + 2 * t])
        if t:
            assert p.startswith(prompts[t - 1]) and len(p) > len(prompts[t - 1])
    assert prompts[-1].endswith(mod.go_on(turns - 2))
