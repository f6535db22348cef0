"""Grammar compiles bounded (issue 47 item 3): a grammar that does not compile within
--grammar-compile-timeout-s or --grammar-compile-memory-mb is a 400 naming the client's field and the
bound, before any role sees it; one the compiler refuses is a 400 with its message; one that compiles
reaches every role unchanged. Worker processes past a bound are killed and replaced; verdicts are
cached in a bounded LRU; a full queue is a 503. Probed with pathological json_schema (deep nesting,
thousands of patternProperties, a 20k enum, recursive $ref), regex, ebnf, structural_tag and tools.

Compile times measured on the CharTokenizer (1024 one-character tokens, one thread, a loaded 2-core
box): json_schema nested 200 deep 7.4 s, 3000 patternProperties 7.9-14.5 s (+320 MB), regex of 1800
groups of 20 alternatives 3.4-7.3 s, ebnf of 30k alternatives 2.3 s, a 20k enum 1.8-2.6 s; a
recursive $ref, nested quantifiers (`(a|aa)*` x 50, `(.{0,1000}){0,1000}`) under 0.2 s. The tests
bound compiles at 0.1 s: each of those is over it by 20x or more, on any machine. No assertion is
on a duration."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from concurrent.futures import Future

import pytest

pytest.importorskip("xgrammar")

from sglang_pdd.lab.testing import fake_upstream as fu  # noqa: E402
from sglang_pdd.lab.testing.slow_grammars import nested  # noqa: E402
from sglang_pdd.router.api.grammar import compile as gc  # noqa: E402
from sglang_pdd.router.api.grammar import guard as grammar_guard  # noqa: E402
from sglang_pdd.router.api.admission import MAX_GRAMMAR_CHARS, BadRequest, ModelLimits  # noqa: E402
from sglang_pdd.router.api.grammar.guard import GrammarBounds, GrammarBusy, GrammarGuard, client_field  # noqa: E402
from tests.unit.router.kit.front_door import connect, metrics_text, refused, request, response, served  # noqa: E402

TIGHT = GrammarBounds(timeout_s=0.1, workers=1)
SAFETY_S = 120.0  # a scenario's safety net (the forkserver's first start imports xgrammar and torch)


DEEP = json.dumps(nested(200))
PATTERNS = json.dumps({"type": "object", "patternProperties": {
    f"^p{i}[a-z]{{3,9}}$": {"type": "string"} for i in range(3000)}})
SLOW = {  # each compiles for seconds (see the module's docstring)
    "json_schema": DEEP,
    "regex": "|".join("(" + "|".join(f"{i}_{j}" for j in range(20)) + ")" for i in range(1800)),
    "ebnf": "root::=" + "|".join(f'"w{i}"' for i in range(30000)),
    "structural_tag": json.dumps({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f>"], "tags": [
        {"begin": "<f>", "content": {"type": "json_schema", "json_schema": nested(200)}, "end": "</f>"}]}}),
}
SLOW_JSON = {"patternProperties": PATTERNS, "enum": json.dumps({"enum": [f"v{i}" for i in range(20000)]})}
FAST = {  # sglang compiles these at once
    "json_schema": json.dumps({"$defs": {"n": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}),  # recursive $ref
    "regex": "(a|aa)*" * 50,
    "ebnf": 'root ::= "yes" | "no"',
    "structural_tag": json.dumps({"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
                                  "triggers": ["<f>"]}),
}
INVALID = [
    ("regex", "(", "regex: the grammar does not compile: Regex parsing error at position 2: The parenthesis is not closed."),
    ("regex", "a\x00", "regex: the grammar does not compile: NUL bytes (\\u0000) are not allowed"),
    ("json_schema", "{not json", "json_schema: the grammar does not compile: "),
    ("ebnf", "root ::= ", "ebnf: the grammar does not compile: "),
    ("structural_tag", json.dumps({"structures": []}), "structural_tag: the grammar does not compile: "),
]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, SAFETY_S))


def test_the_probes_fit_the_routers_length_cap():
    """Each probe is one the router's admission lets through on length (what is longer is refused there)."""
    for source in (*SLOW.values(), *SLOW_JSON.values(), *FAST.values()):
        assert len(source) <= MAX_GRAMMAR_CHARS


async def generate(cluster, sp: dict, grammar: GrammarBounds = TIGHT, limits=ModelLimits(vocab_size=1024)):
    async with fu.router_client(cluster, grammar=grammar, limits=limits) as c:
        r = await c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, **sp}})
        return r.status, await r.text()


def outcome(sp: dict, grammar: GrammarBounds = TIGHT):
    async def go():
        async with fu.FakeCluster() as cl:
            status, text = await generate(cl, sp, grammar)
            return status, text, [r.bodies for r in (cl.prefill, cl.relay, cl.main)]
    return run(go())


@pytest.mark.parametrize("field", sorted(SLOW))
def test_a_slow_grammar_is_a_400_naming_the_field_and_the_bound_and_reaches_no_role(field):
    status, text, bodies = outcome({field: SLOW[field]})
    assert status == 400, text
    assert json.loads(text)["error"]["message"] == (
        f"{field}: the grammar did not compile within 0.1 s (--grammar-compile-timeout-s)")
    assert bodies == [[], [], []]


@pytest.mark.parametrize("probe", sorted(SLOW_JSON))
def test_a_slow_json_schema_is_refused(probe):
    status, text, bodies = outcome({"json_schema": SLOW_JSON[probe]})
    assert status == 400 and "json_schema: the grammar did not compile within 0.1 s" in text
    assert bodies == [[], [], []]


def test_a_grammar_over_the_memory_bound_is_a_400_naming_it():
    """3000 patternProperties take 320 MB to compile: past a 64 MB bound the allocation fails."""
    status, text, bodies = outcome({"json_schema": PATTERNS}, GrammarBounds(timeout_s=120, memory_mb=64, workers=1))
    assert status == 400, text
    assert json.loads(text)["error"]["message"] == (
        "json_schema: compiling the grammar needs more than 64 MB (--grammar-compile-memory-mb)")
    assert bodies == [[], [], []]


def test_the_bound_is_what_refuses_a_slow_grammar_negative_control():
    """The same 20k enum with a bound it fits: compiled, and on to the roles."""
    status, text, bodies = outcome({"json_schema": SLOW_JSON["enum"]}, GrammarBounds(timeout_s=120, workers=1))
    assert status == 200, text
    assert [b[0]["sampling_params"]["json_schema"] for b in bodies if b] == [SLOW_JSON["enum"]] * 2


@pytest.mark.parametrize("field", sorted(FAST))
def test_a_grammar_that_compiles_reaches_every_role_unchanged(field):
    status, text, bodies = outcome({field: FAST[field]}, GrammarBounds(timeout_s=30, workers=1))
    assert status == 200, text
    assert [b[0]["sampling_params"][field] for b in bodies if b] == [FAST[field]] * 2  # P and MD (direct)


@pytest.mark.parametrize("field,source,message", INVALID)
def test_a_grammar_the_compiler_refuses_is_a_400_with_its_message(field, source, message):
    status, text, bodies = outcome({field: source}, GrammarBounds(timeout_s=30, workers=1))
    assert status == 400 and json.loads(text)["error"]["message"].startswith(message), text
    assert bodies == [[], [], []]


def guard(bounds: GrammarBounds = TIGHT) -> GrammarGuard:
    return GrammarGuard(fu.CharTokenizer(), 1024, bounds)


def test_a_worker_past_its_bound_is_replaced_and_the_next_grammar_served():
    g = guard(GrammarBounds(timeout_s=0.1, workers=1))

    async def go():
        with pytest.raises(BadRequest, match="did not compile within 0.1 s"):
            await g.check({"json_schema": DEEP})
        first = g.workers.workers[0].started
        await g.check({"regex": "[a-z]+"})  # served by a fresh worker
        return first, g.workers.workers[0].started, g.workers.workers[0].alive

    try:
        assert run(go()) == (1, 2, True)
    finally:
        g.close()


def test_a_worker_that_crashes_mid_compile_is_a_400_and_is_replaced():
    """A native crash (SIGSEGV, as xgrammar's NUL bug was) ends the worker, not the router; SIGXCPU (its
    CPU bound) reads as the time bound."""
    g = guard(GrammarBounds(timeout_s=60, workers=1))
    w = g.workers.workers[0]

    async def crash(sig: int, source: str):
        await g.check({"regex": f"[a-z]{{{sig}}}"})  # the worker started and ready: the next job goes straight in
        check = asyncio.ensure_future(g.check({"json_schema": source}))
        await asyncio.sleep(0.5)  # in the worker (it compiles for seconds)
        os.kill(w.process.pid, sig)
        with pytest.raises(BadRequest) as e:
            await check
        return str(e.value)

    async def go():
        segv = await crash(signal.SIGSEGV, DEEP)
        xcpu = await crash(signal.SIGXCPU, json.dumps(nested(199)))
        await g.check({"regex": "[a-z]+"})
        return segv, xcpu, w.started

    try:
        segv, xcpu, started = run(go())
    finally:
        g.close()
    assert segv == "json_schema: the grammar compiler crashed on this grammar (SIGSEGV)"
    assert xcpu == "json_schema: the grammar did not compile within 60 s (--grammar-compile-timeout-s)"
    assert started == 3


class CountingWorkers:
    """In place of the worker processes: every grammar compiles (or waits for `gate`); counts compiles."""

    def __init__(self, gate: threading.Event | None = None):
        self.compiled, self.gate = [], gate

    def submit(self, field, source, timeout_s) -> Future:
        self.compiled.append(source)
        f = Future()
        if self.gate is None:
            f.set_result(gc.Verdict(gc.OK))
        else:
            threading.Thread(target=lambda: (self.gate.wait(30), f.set_result(gc.Verdict(gc.OK)))).start()
        return f

    def close(self):
        pass


def test_the_verdict_cache_is_bounded_and_a_repeated_grammar_costs_nothing(monkeypatch):
    monkeypatch.setattr(grammar_guard, "MAX_VERDICTS", 3)
    g = guard()
    g.workers = fake = CountingWorkers()

    async def go():
        for i in range(4):
            await g.check({"regex": f"a{i}"})
        size = len(g.verdicts)
        await g.check({"regex": "a3"})  # kept: no compile
        await g.check({"regex": "a0"})  # the oldest, dropped: compiled again
        return size

    assert run(go()) == 3 and len(g.verdicts) == 3
    assert fake.compiled == ["a0", "a1", "a2", "a3", "a0"]


def test_requests_with_the_same_grammar_share_one_compile():
    g = guard()
    gate = threading.Event()
    g.workers = fake = CountingWorkers(gate)

    async def go():
        checks = [asyncio.ensure_future(g.check({"regex": "a+"})) for _ in range(20)]
        await asyncio.sleep(0.05)
        pending = g.pending
        gate.set()
        await asyncio.gather(*checks)
        return pending

    assert run(go()) == 1 and fake.compiled == ["a+"]


def test_past_the_queue_a_grammar_is_a_503_with_retry_after_counted():
    gate = threading.Event()

    async def go():
        async with served(app_kw={"grammar": GrammarBounds(workers=1)}) as (app, port):
            app.grammar.workers = CountingWorkers(gate)
            app.d.release.set()
            cap = app.grammar.capacity
            held = [await connect(port, gen({"regex": f"a{i}"})) for i in range(cap)]
            while app.grammar.pending < cap:
                await asyncio.sleep(0.01)
            r, w = await connect(port, gen({"regex": "b"}))
            full = await response(r)
            gate.set()
            done = [(await response(x[0]))[0] for x in held]
            counts = refused(await metrics_text(port))
            for x in (*held, (r, w)):
                x[1].close()
            return cap, full, done, counts

    cap, full, done, counts = run(go())
    assert cap == 5  # one worker, four waiting
    assert full[0] == 503 and full[1]["retry-after"] == "1" and b"--grammar-workers" in full[2]
    assert done == [200] * cap and counts["grammar-queue"] == 1


def gen(sp: dict) -> bytes:
    body = {"text": "ab", "sampling_params": {"max_new_tokens": 2, **sp}}
    return request("POST", "/generate", json.dumps(body).encode())


def test_without_xgrammar_a_grammar_is_a_400_and_a_plain_request_is_served():
    g = guard()
    g.available = False

    async def go():
        await g.check({"max_new_tokens": 2})  # no grammar: nothing to check
        with pytest.raises(BadRequest, match="regex: this router cannot check grammars .xgrammar is not installed"):
            await g.check({"regex": "a+"})

    run(go())


def test_workers_that_cannot_start_are_a_503_not_counted_as_a_refusal():
    class Unpicklable(fu.CharTokenizer):
        def __reduce__(self):
            raise TypeError("no")

    g = GrammarGuard(Unpicklable(), 1024, TIGHT)

    async def go():
        with pytest.raises(GrammarBusy) as e:
            await g.check({"regex": "a+"})
        return e.value

    try:
        e = run(go())
    finally:
        g.close()
    assert e.reason is None and "cannot be sent to a grammar worker" in str(e) and len(g.verdicts) == 0


def test_the_client_field_is_named():
    assert client_field("regex", {"sampling_params": {"regex": "a"}}) == "regex"
    assert client_field("regex", {"messages": [], "regex": "a"}) == "regex"  # sglang's chat extension
    assert client_field("json_schema", {"messages": [], "response_format": {"type": "json_schema"}}) == "response_format"
    assert client_field("structural_tag", {"messages": [], "tools": [{}]}) == "tools"
    assert client_field("structural_tag", {"messages": [], "tools": [{}], "response_format": {"type": "text"}}) == "tools"


def test_the_bounds_must_be_positive():
    for bad in ({"timeout_s": 0}, {"memory_mb": 0}, {"workers": 0}):
        with pytest.raises(ValueError, match="must be positive"):
            GrammarBounds(**bad)


# -- sglang's chat layer: tools and response_format ----------------------------------------------------

@pytest.fixture(scope="module")
def layer(tiny_model):
    from sglang_pdd.router.api.openai.sglang_server import OpenAIConfig, SglangOpenAI

    return SglangOpenAI(OpenAIConfig(tiny_model, "tiny", tool_call_parser="qwen25"))


def tool(i: int, depth: int) -> dict:
    """A strict tool: sglang constrains its arguments by its schema (a tool that is not leaves them free)."""
    return {"type": "function", "function": {"name": f"f{i}", "parameters": nested(depth), "strict": True}}


def chat(layer, body: dict, grammar: GrammarBounds):
    async def go():
        async with fu.FakeCluster() as cl:
            limits = ModelLimits(vocab_size=len(layer.tokenizer), context_len=1 << 20)
            async with fu.router_client(cl, tokenizer=layer.tokenizer, openai=layer, limits=limits,
                                        grammar=grammar) as c:
                r = await c.post("/v1/chat/completions", json={
                    "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
                return r.status, await r.text(), [r.bodies for r in (cl.prefill, cl.relay, cl.main)]
    return run(go())


def test_a_tools_list_whose_structural_tag_is_slow_is_a_400_naming_tools(layer):
    # 3000 patternProperties: 2.8-3.6 s (48 tools nested 60 deep, before: 0.09-0.15 s, at the bound; sglang's
    # chat layer refuses a tool nested 150 deep or more itself)
    tools = [{"type": "function", "function": {"name": "f", "parameters": json.loads(PATTERNS), "strict": True}}]
    status, text, bodies = chat(layer, {"tools": tools, "tool_choice": "required"}, TIGHT)
    assert status == 400, text
    assert json.loads(text)["error"]["message"] == (
        "tools: the grammar did not compile within 0.1 s (--grammar-compile-timeout-s)")
    assert bodies == [[], [], []]


def test_a_slow_response_format_is_a_400_naming_it(layer):
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(200)}}
    status, text, bodies = chat(layer, {"response_format": fmt}, TIGHT)
    assert status == 400 and json.loads(text)["error"]["message"].startswith(
        "response_format: the grammar did not compile within 0.1 s"), text
    assert bodies == [[], [], []]


def test_a_tool_that_compiles_reaches_the_roles_with_its_structural_tag(layer):
    status, text, bodies = chat(layer, {"tools": [tool(0, 2)], "tool_choice": "required"},
                                GrammarBounds(timeout_s=60, workers=1))
    assert status == 200, text
    tags = [json.loads(b[0]["sampling_params"]["structural_tag"]) for b in bodies if b]
    assert len(tags) == 2 and tags[0] == tags[1] and tags[0]["triggers"] == ["<tool_call>"]


# -- the verdict predicts the roles': sglang's own xgrammar backend ------------------------------------

def test_the_verdict_is_sglangs(layer):
    """Every probe that compiles quickly, valid or not, through sglang's XGrammarGrammarBackend (what each
    role runs) and through the router's compile: both accept or both refuse."""
    import xgrammar as xgr
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    tok = layer.tokenizer
    backend = XGrammarGrammarBackend(tok, vocab_size=len(tok))
    ours = xgr.GrammarCompiler(gc.tokenizer_info(tok, len(tok)), max_threads=1, cache_enabled=False)
    kinds = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf", "structural_tag": "structural_tag"}
    probes = [*FAST.items(), *((f, s) for f, s, _ in INVALID), ("json_schema", "$$ANY$$"),
              ("structural_tag", json.dumps({"type": "structural_tag", "format": {
                  "type": "triggered_tags", "triggers": ["<f>"],
                  "tags": [{"begin": "<f>", "content": {"type": "json_schema"}, "end": "</f>"}]}})),
              ("structural_tag", json.dumps({"format": None})), ("json_schema", '{"type": "nope"}')]
    for field, source in probes:
        if "\x00" in source:  # sglang refuses a NUL before its backend sees it (it would crash xgrammar)
            continue
        try:  # sglang's grammar manager turns an exception of its backend into an invalid grammar
            theirs = not isinstance(backend._init_value_dispatch((kinds[field], source), False), InvalidGrammarObject)
        except Exception:
            theirs = False
        assert theirs == (gc.compile_grammar(ours, field, source).status == gc.OK), (field, source[:80])
