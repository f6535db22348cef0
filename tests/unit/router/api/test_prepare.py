"""Bodies are parsed and tokenized off the router's event loop (issue 14 item 4): while one client's
prompt is being tokenized, the router keeps serving everyone else."""

import asyncio
import json
import threading

from sglang_pdd.lab.testing import fake_upstream as fu


class BlockingTokenizer(fu.CharTokenizer):
    """encode() waits until the test lets it go, and records the thread it ran on."""

    def __init__(self):
        self.release, self.entered, self.threads = threading.Event(), threading.Event(), []

    def __deepcopy__(self, memo):  # one shared spy (the router copies its tokenizer per worker)
        return self

    def encode(self, text, add_special_tokens=False):
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.release.wait(20), "never released"
        return super().encode(text)


def test_a_slow_tokenization_does_not_stall_the_router():
    tok = BlockingTokenizer()

    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl, tokenizer=tok) as c:
                slow = asyncio.create_task(c.post("/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 2}}))
                await asyncio.get_running_loop().run_in_executor(None, tok.entered.wait, 20)
                health = await c.get("/health")  # answered while encode() is still blocked
                other = await c.post("/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 2}})
                got = (health.status, other.status, await other.json())
                tok.release.set()
                r = await slow
                return got, r.status, (await r.json())["text"], threading.get_ident()

    (health, other, other_body), slow_status, slow_text, loop_thread = asyncio.run(asyncio.wait_for(go(), 30))
    assert health == 200 and other == 200 and other_body["text"] == "ab"
    assert slow_status == 200 and slow_text == "ab"
    assert tok.threads and all(t != loop_thread for t in tok.threads)


# -- issue 47: every place text can hide is bounded before a template renders it; a job whose client
# left stops at its next stage ----------------------------------------------------------------------
import pytest  # noqa: E402

from sglang_pdd.router.api.admission import BadRequest, ModelLimits  # noqa: E402
from sglang_pdd.router.api.prepare import Abandoned, Preparer, text_chars  # noqa: E402


class NoTemplate(fu.CharTokenizer):
    """A tokenizer whose template must not run (the body is refused before it)."""

    def apply_chat_template(self, *a, **kw):
        raise AssertionError("the template rendered a body the pre-check must refuse")


class NoLayer:
    """sglang's chat layer, which must not be reached (its conversion renders the template)."""

    def chat_for_thread(self):
        raise AssertionError("sglang's layer got a body the pre-check must refuse")


def _preparer(tok=None, context_len=64, openai=None) -> Preparer:
    return Preparer(tok or NoTemplate(), ModelLimits(vocab_size=1024, context_len=context_len), 8, workers=1,
                    openai=openai)


BIG = "x" * 300_000  # the char tokenizer: longest token 1 char, context 64: at most 256 characters


HIDDEN_TEXT = [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": BIG}]}]},  # list-form content parts
    {"messages": [{"role": "user", "content": [{"type": "text", "text": BIG[:200]}] * 2}]},  # parts add up
    {"messages": [{"role": "user", "content": "hi", "name": BIG}]},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": BIG}}]}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": BIG, "parameters": {}}}]},
    {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"system": BIG}},
    {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {BIG: 1}},  # a key is text too
]


@pytest.mark.parametrize("body, layer", [(b, layer) for b in HIDDEN_TEXT for layer in ("sglang", "builtin")
                                         if not (layer == "builtin" and "tools" in b)])  # builtin: tools, a 400 by name
def test_chat_text_anywhere_is_bounded_before_the_template(body, layer):
    with pytest.raises(BadRequest, match="characters\\) is longer than the model's context length"):
        _preparer(openai=NoLayer() if layer == "sglang" else None).prepare("chat", json.dumps(body).encode())


def test_completion_prompt_lists_are_bounded_before_tokenizing():
    with pytest.raises(BadRequest, match="characters\\) is longer"):
        _preparer().prepare("completions", json.dumps({"prompt": [BIG]}).encode())


def test_text_chars_walks_any_depth_without_recursion():
    deep: list = ["ab"]
    for _ in range(100_000):
        deep = [deep]
    assert text_chars(deep) == 2
    assert text_chars({"k": ["ab", {"cd": "e"}], "n": 5}) == 1 + 2 + 2 + 1 + 1  # keys k, cd, n


def test_a_prompt_within_the_bound_still_renders():
    class Template(fu.CharTokenizer):
        pass

    got = _preparer(Template()).prepare("chat", json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())
    assert got.ids == [ord("h"), ord("i")]


def test_a_job_whose_client_left_stops_before_tokenizing():
    """The client goes away while its job parses: the worker does not go on to tokenize."""
    tok = BlockingTokenizer()
    prep = Preparer(tok, ModelLimits(vocab_size=1024, context_len=4096), 8, workers=1)
    parsed, go_on = threading.Event(), threading.Event()
    real_stage = prep._stage

    def stage():  # the first stage boundary (after parsing) waits until the client has gone
        if not parsed.is_set():
            parsed.set()
            assert go_on.wait(20)
        real_stage()

    prep._stage = stage
    outcome: dict = {}

    async def go():
        task = asyncio.ensure_future(prep.run("generate", json.dumps({"text": "abc"}).encode()))
        await asyncio.get_running_loop().run_in_executor(None, parsed.wait, 20)
        task.cancel()  # the client left
        await asyncio.gather(task, return_exceptions=True)
        go_on.set()
        while prep.pending:  # the worker finished the job
            await asyncio.sleep(0.01)
        outcome["pending"] = prep.pending

    asyncio.run(asyncio.wait_for(go(), 30))
    prep.close()
    assert not tok.entered.is_set()  # never tokenized
    assert outcome["pending"] == 0


def test_abandoned_is_not_a_client_error():
    assert not issubclass(Abandoned, BadRequest)


@pytest.mark.parametrize("body, match", [
    ({"messages": [{"role": "user", "content": ""}] * 65}, "65 messages are more than the model's context length"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools: at most 128 tools, got 129"),
])
def test_list_shaped_chat_fields_are_capped(body, match):
    with pytest.raises(BadRequest, match=match):
        _preparer(openai=NoLayer()).prepare("chat", json.dumps(body).encode())
