"""Inside a grammar-check worker process (`router.api.grammar.workers` starts it): a client's grammar
compiled as sglang's xgrammar backend compiles it on every role, under the worker's bounds.

Each kind goes to the xgrammar call sglang 0.5.23's `XGrammarGrammarBackend.dispatch_*` makes, with
its defaults (any whitespace, no whitespace cap: a role's `--constrained-json-*` flags are not seen
here): `json_schema` ("$$ANY$$": the builtin JSON grammar), `regex`, `ebnf`, `structural_tag` (the
legacy `structures`/`triggers` form or a `format`, missing schemas filled in as sglang does). A NUL
anywhere is refused first, as sglang refuses it (it crashes xgrammar's regex converter). The
compiler runs on one thread with its cache off: the verdict is about this grammar alone, and a role
(8 threads) compiles what passed here at least as fast. sglang's `validate_xgrammar_json_schema`
(schema keywords xgrammar would ignore) is not run: a role refuses those itself before it compiles.

Bounds: the worker's address space may grow `memory_mb` past what it holds once ready (RLIMIT_AS:
an allocation past it fails, and xgrammar raises `std::bad_alloc`), and each job may use `cpu_s`
seconds of CPU (RLIMIT_CPU, rounded up: SIGXCPU ends the worker); the router also kills a worker
past its wall-clock bound. A worker whose allocation failed reports it and exits.

Messages on the pipe are the NamedTuples below; `Ready` carries `VERSION` (parent and worker are
the same code, checked anyway).
"""

from __future__ import annotations

import json
import math
import pickle
import re
import resource
import signal
from typing import NamedTuple

VERSION = 1
FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")  # a sampling parameter -> its compile below
OK, INVALID, TIME, MEMORY, CRASHED, UNAVAILABLE = "ok", "invalid", "time", "memory", "crashed", "unavailable"
MAX_DETAIL = 400  # characters of a compiler's message passed on


class Job(NamedTuple):
    field: str  # one of FIELDS
    source: str
    cpu_s: float


class Verdict(NamedTuple):
    status: str  # OK, INVALID, TIME, MEMORY, CRASHED, UNAVAILABLE
    detail: str = ""  # the compiler's message (INVALID), the signal (CRASHED), why (UNAVAILABLE)


class Ready(NamedTuple):
    version: int
    error: str = ""  # the worker could not start: why


_WHERE = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[05:18:13] /project/cpp/x.cc:83: " prefix


def _has_nul(field: str, source: str) -> bool:
    """A NUL in the source, or in a string of a JSON one (sglang's `_grammar_key_contains_nul`)."""
    if "\x00" in source:
        return True
    if field not in ("json_schema", "structural_tag"):
        return False
    try:
        stack = [json.loads(source)]
    except ValueError:
        return False
    while stack:
        node = stack.pop()
        if isinstance(node, str) and "\x00" in node:
            return True
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _fill_schemas(fmt) -> None:
    """sglang's `_sanitize_structural_format`: a missing json_schema is the empty schema."""
    stack = [fmt]
    while stack:
        f = stack.pop()
        if not isinstance(f, dict):
            continue
        kind = f.get("type")
        if kind in ("json_schema", "qwen_xml_parameter") and f.get("json_schema") is None:
            f["json_schema"] = {}
        if kind == "tag":
            stack.append(f.get("content"))
        elif kind in ("sequence", "or"):
            stack.extend(f.get("elements", []))
        elif kind in ("triggered_tags", "tags_with_separator"):
            stack.extend(f.get("tags", []))


def _structural_tag(compiler, source: str):
    import xgrammar as xgr

    tag = json.loads(source)
    if tag.get("structures") is not None:  # the legacy form
        assert tag.get("triggers") is not None, "a structural tag with structures needs triggers"
        items = [xgr.StructuralTagItem(begin=s["begin"], end=s["end"],
                                       schema=json.dumps({} if s.get("schema") is None else s["schema"]))
                 for s in tag["structures"]]
        new = xgr.StructuralTag.from_legacy_structural_tag(items, tag["triggers"])
        new.format.at_least_one = tag.get("at_least_one", False)
        return compiler.compile_structural_tag(new)
    assert tag.get("format") is not None, "a structural tag needs a format"
    if isinstance(tag["format"], dict):
        _fill_schemas(tag["format"])
        source = json.dumps(tag)
    return compiler.compile_structural_tag(source)


def compile_grammar(compiler, field: str, source: str) -> Verdict:
    """One grammar through `compiler` (an xgrammar GrammarCompiler) as a role would compile it."""
    if _has_nul(field, source):
        return Verdict(INVALID, "NUL bytes (\\u0000) are not allowed")
    try:
        if field == "json_schema":
            if source == "$$ANY$$":
                compiler.compile_builtin_json_grammar()
            else:
                compiler.compile_json_schema(source, any_whitespace=True, max_whitespace_cnt=None)
        elif field == "regex":
            compiler.compile_regex(source)
        elif field == "ebnf":
            compiler.compile_grammar(source)
        elif field == "structural_tag":
            _structural_tag(compiler, source)
        else:
            return Verdict(INVALID, f"no grammar kind {field!r}")
    except MemoryError:
        return Verdict(MEMORY)
    except Exception as e:  # sglang turns any compile error into an invalid grammar (a 400)
        text = str(e)
        if "bad_alloc" in text:
            return Verdict(MEMORY)
        return Verdict(INVALID, _WHERE.sub("", text.strip())[:MAX_DETAIL] or type(e).__name__)
    return Verdict(OK)


def tokenizer_info(tokenizer, vocab_size: int | None):
    """xgrammar's view of the router's tokenizer, as a role builds it (`TokenizerInfo.from_huggingface`
    with the model's vocabulary size); a tokenizer that is not a Hugging Face one by its vocabulary
    (`get_vocab()`: text -> id; ids it does not name are empty, special, tokens)."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerBase

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = tokenizer.get_vocab()
    size = max(vocab_size or 0, max(vocab.values(), default=-1) + 1)
    encoded = [""] * size
    for text, i in vocab.items():
        encoded[i] = text
    return xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=size)


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _bound_memory(memory_mb: int) -> None:
    limit = _address_space() + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _bound_cpu(cpu_s: float) -> None:
    """This job may use `cpu_s` more seconds of CPU (the soft limit moves; the hard one stays)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(used.ru_utime + used.ru_stime + cpu_s), hard))


def serve(conn, tokenizer_blob: bytes, vocab_size: int | None, memory_mb: int) -> None:
    """The worker's main: get ready (the compiler built and warmed, then bounded), then compile each
    `Job` it is sent and answer its `Verdict`, until the pipe closes."""
    try:
        import xgrammar as xgr

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU would dump core
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL):
            signal.signal(sig, signal.SIG_DFL)  # a crash ends the worker now (tvm-ffi's handler prints, may hang)
        compiler = xgr.GrammarCompiler(tokenizer_info(pickle.loads(tokenizer_blob), vocab_size), max_threads=1,
                                       cache_enabled=False)
        compiler.compile_regex("[a-z]+")  # first-use allocations before the bound
        _bound_memory(memory_mb)
    except Exception as e:
        conn.send(Ready(VERSION, f"{type(e).__name__}: {e}"[:MAX_DETAIL]))
        return
    conn.send(Ready(VERSION))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        _bound_cpu(job.cpu_s)
        verdict = compile_grammar(compiler, job.field, job.source)
        conn.send(verdict)
        if verdict.status == MEMORY:
            return
