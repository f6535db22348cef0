"""MD's handoff EXTEND and a constrained request's grammar (extend_batch._prepare_req), on a real
xgrammar matcher over the tiny model's tokenizer: after the EXTEND's preparation the grammar is where
a single server's is after t1..tk (P's t1 included), and a token it refuses ends that request only.
The end-to-end proof (outputs equal a single server's, with a negative control) is in
tests/e2e/test_pdd_router.py."""

from types import SimpleNamespace

import pytest

xgr = pytest.importorskip("xgrammar")
pytest.importorskip("sglang")

from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT  # noqa: E402

from sglang_pdd.decode.main.extend_batch import _prepare_req  # noqa: E402
from sglang_pdd.lab.testing.tiny_model import TinyModelSpec, build_tokenizer  # noqa: E402

REGEX = r"(yes|no), [a-z]{3,8} [0-9]{2,4}\."
VOCAB = TinyModelSpec().vocab


@pytest.fixture(scope="module")
def tok_and_ctx():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(TinyModelSpec()), bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB, stop_token_ids=[tok.eos_token_id])
    return tok, xgr.GrammarCompiler(info).compile_regex(REGEX)


def new_grammar(ctx) -> XGrammarGrammar:
    return XGrammarGrammar(xgr.GrammarMatcher(ctx, max_rollback_tokens=200), VOCAB, ctx, None)


def mask(grammar):
    m = grammar.allocate_vocab_mask(VOCAB, 1, "cpu")
    grammar.fill_vocab_mask(m, 0)
    return m


def single_server(ctx, tokens):
    """A single server's grammar after sampling `tokens` one by one."""
    g = new_grammar(ctx)
    for t in tokens:
        g.accept_token(t)
    return g


def held(ctx, n: int, outputs: list[int]):
    """MD's held request: n prompt tokens of KV, `outputs` so far (P's t1 at start 0), a fresh grammar."""
    return SimpleNamespace(rid="r", origin_input_ids=[9] * n, output_ids=list(outputs),
                           kv=SimpleNamespace(kv_committed_len=n),
                           retracted_stain=True, grammar=new_grammar(ctx), return_logprob=False, to_finish=None,
                           prefix_len=0, extend_end=0, refresh_fill_ids=lambda: None)


def test_the_grammar_after_the_handoff_is_the_single_servers_with_t1_accepted(tok_and_ctx):
    tok, ctx = tok_and_ctx
    eager = tok.encode("yes, fexru", add_special_tokens=False)  # t1..tk, as RLD relays them
    assert len(eager) >= 3
    req = held(ctx, 50, eager[:1])  # P's t1
    _prepare_req(req, 0, eager, tree_cache=None, drc=False, logprobs=None)
    assert list(req.output_ids) == eager and req.to_finish is None
    assert (req.prefix_len, req.extend_end) == (50, 50 + len(eager))
    want = mask(single_server(ctx, eager))
    assert bool((mask(req.grammar) == want).all())
    # the masks tell the states apart: one token behind, or none accepted (the e2e control's state)
    assert not bool((mask(single_server(ctx, eager[:-1])) == want).all())
    assert not bool((mask(new_grammar(ctx)) == want).all())
    assert req.grammar.accepted_tokens == eager


def test_catch_up_chunks_advance_the_grammar_chunk_by_chunk(tok_and_ctx):
    tok, ctx = tok_and_ctx
    eager = tok.encode("no, tusrosti 4044", add_special_tokens=False)
    req = held(ctx, 30, eager[:1])
    _prepare_req(req, 0, eager[:3], tree_cache=None, drc=False, logprobs=None)
    req.kv.kv_committed_len = 30 + 3  # the chunk's EXTEND wrote its KV; its sampled token was dropped
    _prepare_req(req, 3, eager[3:], tree_cache=None, drc=False, logprobs=None)
    assert list(req.output_ids) == eager and req.grammar.accepted_tokens == eager
    assert bool((mask(req.grammar) == mask(single_server(ctx, eager))).all())


def test_a_relayed_token_the_grammar_refuses_ends_that_request_with_a_clear_error(tok_and_ctx):
    tok, ctx = tok_and_ctx
    eager = tok.encode("yes, ", add_special_tokens=False) + tok.encode("123", add_special_tokens=False)
    req = held(ctx, 20, eager[:1])
    _prepare_req(req, 0, eager, tree_cache=None, drc=False, logprobs=None)  # no exception: the batch goes on
    assert isinstance(req.to_finish, FINISH_ABORT)
    info = req.to_finish.to_json()
    assert info["status_code"] == 500 and "grammar refused relayed token" in info["message"], info
    assert req.extend_end == 20 + len(eager)  # the EXTEND still runs; sglang's result processing ends it
