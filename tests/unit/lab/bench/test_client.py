"""Contract of the streaming client's parsing and of the closed-loop replay (a fake system)."""

import threading

import pytest

from sglang_pdd.lab.bench.client import StreamResult, merge_output_ids, parse_sse_line
from sglang_pdd.lab.bench.presets import select
from sglang_pdd.lab.bench.replay import replay, sessions, warm_up
from sglang_pdd.lab.workload.generator import generate, measured
from sglang_pdd.lab.sim.presets import tiny_workload


def test_sse_lines_parse_and_keepalives_are_skipped():
    assert parse_sse_line(b'data: {"text": "a", "output_ids": [5]}\n') == {"text": "a", "output_ids": [5]}
    assert parse_sse_line(b"data: [DONE]\n") is None
    assert parse_sse_line(b"\n") is None
    assert parse_sse_line(b": ping\n") is None


def test_output_ids_accumulate_from_cumulative_or_delta_chunks():
    assert merge_output_ids([], [7]) == [7]
    assert merge_output_ids([7], [7, 8, 9]) == [7, 8, 9]  # cumulative (sglang's default)
    assert merge_output_ids([7, 8], [3]) == [7, 8, 3]  # delta


@pytest.fixture(scope="module")
def trace():
    wl = tiny_workload(duration_s=30.0, think_time_s=0.0, input_len=tiny_workload().input_len)
    return select(generate(wl), max_sessions=3, max_turns=3), wl.vocab_size


def _output_for(ids, n):
    """The fake model: a deterministic output depending on the whole prompt."""
    h = hash(tuple(ids))
    return [16 + (h >> (3 * i)) % 1000 for i in range(n)]


def test_later_turns_carry_the_previous_turns_real_output(trace):
    reqs, vocab = trace
    sent, lock = [], threading.Lock()

    def send(body, timeout_s):
        ids = body["input_ids"]
        out = _output_for(ids, body["sampling_params"]["max_new_tokens"])
        with lock:
            sent.append(tuple(ids))
        return StreamResult(True, ttft_s=0.01, e2e_s=0.01 + 0.01 * (len(out) - 1), prompt_tokens=len(ids),
                            output_tokens=len(out), output_ids=out)

    fast = [r if r.warmup else r.__class__(**{**r.__dict__, "arrival_s": 0.0, "think_s": 0.0}) for r in reqs]
    recs = replay(send, fast, vocab, timeout_s=5.0)
    assert [r.request_id for r in recs] == [r.request_id for r in measured(reqs)]
    assert all(r.ok for r in recs) and all(r.tpot_s == pytest.approx(0.01) for r in recs)
    differs = 0
    for turns in sessions(reqs).values():
        outputs = {}
        for r in turns:
            ids = r.token_ids(vocab, outputs)
            assert tuple(ids) in sent
            differs += ids != r.token_ids(vocab)  # the stand-in prompt is not what was sent
            outputs[r.turn] = _output_for(ids, r.max_output_tokens)
    assert differs > 0


def test_warm_ups_are_sent_alone_and_failures_counted(trace):
    reqs, vocab = trace
    sent = []

    def send(body, timeout_s):
        sent.append(len(body["input_ids"]))
        return StreamResult(len(sent) != 1, error="boom")

    n_warm = sum(r.warmup for r in reqs)
    assert n_warm > 0
    assert warm_up(send, reqs, vocab, 5.0) == 1
    assert sent == [r.input_len for r in reqs if r.warmup]
