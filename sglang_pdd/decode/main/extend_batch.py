"""The extend-decode handoff step on MainDecode: ONE `ForwardMode.EXTEND` batch over the eager tokens.

For each request the row already holds KV[0, n) (prompt, transferred from P, part of it from MD's own
radix cache) and `output_ids == [t1]` (from P's metadata). The batch runs [t1..tk] at positions
[n, n+k) on top of that prefix, writes their KV into MD's pool and samples t(k+1) from the last
position. sglang's own `prepare_for_extend` does the work: it reuses the request's row (it holds KV),
continues a partial last page via `last_loc`, and allocates the k new slots. sglang then routes the
result through `process_batch_result_prefill` (sample, stream, checkpoint into the radix tree), and
the hook merges the batch into the running decode batch on the next iteration.

Bookkeeping mirrors `prepare_for_prebuilt` (cached-token accounting) and avoids its pitfalls:
`refresh_fill_ids()` after the eager tokens are appended, `prefix_len = n` (prealloc left the radix
hit there), no input logprobs for the eager tokens (`logprob_start_len = -1` while preparing; their
output logprobs come from the relay), grammar and penalizers see t1..tk.

Catch-up runs the same step over chunks: a chunk from eager index `start` extends a row that holds
KV[0, n+start) (prefix_len = n+start, like a later chunk of chunked prefill). A non-final chunk's
result is taken by the runtime instead of sglang: its sampled token is dropped and nothing streams.
"""

from __future__ import annotations

from typing import Any


class HandoffError(RuntimeError):
    pass


def slots_needed(n_prompt: int, k: int, page_size: int) -> int:
    """KV slots the EXTEND allocates for one request (page-rounded, an upper bound)."""
    return -(-(n_prompt + k) // page_size) * page_size - (n_prompt // page_size) * page_size


def _prepare_req(req, start: int, tokens: list[int], tree_cache, drc: bool, logprobs: list[float] | None) -> None:
    """Set the request up to EXTEND over eager tokens t(start+1)..: its row holds KV[0, n+start)."""
    from sglang.srt.disaggregation.decode import _bind_root_prefix

    n = len(req.origin_input_ids)
    outputs = 1 if start == 0 else start  # at start 0 the one output is P's t1, replaced by RLD's
    if len(req.output_ids) != outputs or req.kv.kv_committed_len != n + start:
        raise HandoffError(f"request {req.rid}: expected {outputs} outputs and {n + start} committed KV, got "
                           f"{len(req.output_ids)} and {req.kv.kv_committed_len}")
    if start == 0:
        if drc and req.last_node is None:
            _bind_root_prefix(req, tree_cache)
        if not req.retracted_stain:
            delta = max(0, req.prefix_len - req.already_computed)
            req.cached_tokens += delta
            req.cached_tokens_device += delta
            req.already_computed = n
            req._cache_breakdown_computed = True
    del req.output_ids[start:]  # a list or an array.array, depending on the sglang build
    req.output_ids.extend(int(t) for t in tokens)
    if req.grammar is not None:
        _advance_grammar(req, tokens)
    if req.return_logprob:
        _append_logprobs(req.logprob, tokens, logprobs, skip_first=start == 0)  # P sent t1's logprob
    req.refresh_fill_ids()
    req.prefix_len = n + start
    req.extend_end = n + start + len(tokens)


def _advance_grammar(req, tokens: list[int]) -> None:
    """The request's grammar accepts the eager tokens before the EXTEND's vocabulary mask is built, so
    t(k+1) is sampled from a single server's grammar state. At start 0 that includes P's t1 (RLD's
    first token): a held request never passes sglang's `process_prebuilt`, which accepts it on plain
    PD. A token the grammar refuses ends this request only, as sglang's own prefill and prebuilt paths
    do (`to_finish`: the EXTEND still runs, sglang's result processing ends it with the error)."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    for t in tokens:
        try:
            req.grammar.accept_token(int(t))
        except ValueError as e:
            req.to_finish = FINISH_ABORT(f"pdd: the request's grammar refused relayed token {int(t)}: "
                                         f"{str(e).splitlines()[0]}", HTTPStatus.INTERNAL_SERVER_ERROR)
            return


def _append_logprobs(lp, tokens: list[int], logprobs: list[float] | None, skip_first: bool) -> None:
    extra = tokens[1:] if skip_first else tokens
    vals = logprobs[len(tokens) - len(extra):] if logprobs and len(logprobs) == len(tokens) else [0.0] * len(extra)
    lp.output_token_logprobs_val.extend(vals)
    lp.output_token_logprobs_idx.extend(int(t) for t in extra)
    if lp.top_logprobs_num > 0:
        lp.output_top_logprobs_val.extend([] for _ in extra)
        lp.output_top_logprobs_idx.extend([] for _ in extra)
    if lp.token_ids_logprob is not None:
        lp.output_token_ids_logprobs_val.extend([] for _ in extra)
        lp.output_token_ids_logprobs_idx.extend([] for _ in extra)


def build(scheduler, items: list, final: bool = True):
    """Prepare the requests (`main.handoff.Pending` items) and return the EXTEND `ScheduleBatch`.
    `final`: the handoff's last tokens (sglang samples and streams the next one); otherwise catch-up
    chunks, whose result the runtime takes instead of sglang (no penalties: nothing is sampled)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.runtime_context import get_disagg

    drc = bool(get_disagg().disaggregation_decode_enable_radix_cache)
    reqs = []
    for p in items:
        _prepare_req(p.req, p.have, p.tokens, scheduler.tree_cache, drc, p.logprobs)
        reqs.append(p.req)
    batch = ScheduleBatch.init_new(
        reqs, scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator, scheduler.tree_cache,
        scheduler.model_config, scheduler.enable_overlap, scheduler.spec_algorithm,
    )
    saved = [r.logprob_start_len for r in reqs]
    for r in reqs:
        r.logprob_start_len = -1
    try:
        batch.prepare_for_extend()
    finally:
        for r, s in zip(reqs, saved):
            r.logprob_start_len = s
    if final:
        _count_penalties(batch, [list(p.req.output_ids) for p in items])
    return batch


def merged(running_batch, extend):
    """The running batch with last iteration's handoff EXTEND merged in (its finished requests out)."""
    extend.filter_batch()
    if extend.is_empty():
        return running_batch
    if running_batch.is_empty():
        return extend
    running_batch.merge_batch(extend)
    return running_batch


def needs_penalties(req) -> bool:
    """Requests whose sampling depends on their earlier outputs: they take the EXTEND alone."""
    sp = req.sampling_params
    return bool(getattr(sp, "frequency_penalty", 0) or getattr(sp, "presence_penalty", 0)
                or getattr(sp, "min_new_tokens", 0) or (getattr(sp, "repetition_penalty", 1.0) or 1.0) != 1.0)


def _count_penalties(batch, token_lists: list[list[int]]) -> None:
    """Penalizers must have seen t1..tk as outputs before t(k+1) is sampled, as in plain decode
    (where each output is counted when it becomes a step's input). The batch's penalizer state is
    new, so all k count, catch-up chunks included. `take_ready` gives such a request a batch of its
    own, so every column below is full."""
    orch = getattr(batch.sampling_info, "penalizer_orchestrator", None)
    if orch is None or not getattr(orch, "is_required", False):
        return
    import torch

    if len({len(t) for t in token_lists}) != 1:
        raise HandoffError("penalized requests must take the handoff EXTEND alone")
    for j in range(len(token_lists[0])):
        col = [t[j] for t in token_lists]
        orch.cumulate_output_tokens(torch.tensor(col, dtype=torch.int64, device=batch.device))
