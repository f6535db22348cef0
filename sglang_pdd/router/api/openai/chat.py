"""/v1/chat/completions through sglang's own OpenAI chat layer (`router.api.openai.sglang_server`).

The request was converted in a tokenizer thread (`prepare.Preparer`): sglang's `GenerateReqInput`
(prompt IDs, sampling parameters with any tool or response-format constraint, logprob options). Here
it goes through PDD's dispatcher like any request, and sglang's chat class builds the answer from the
stitched stream (`router.api.openai.feed`): the whole response, or the SSE chunks as sglang's server
streams them. The router's own rules hold as for every endpoint: an error before the first token is
answered with its status, one after it ends the stream with an error chunk; the client leaving aborts
every role's copy (the caller closes the dispatcher's stream).
"""

from __future__ import annotations

import uuid

from aiohttp import web

from sglang_pdd.router.api.openai import feed as openai_feed
from sglang_pdd.router.request.dispatch import Outcome, RequestFailed
from sglang_pdd.router.request.first_token import FirstToken


def role_extra(adapted) -> dict:
    """What each role's copy is asked for besides the tokens and sampling parameters, as sglang's chat
    layer asks its own scheduler: logprobs, and `require_reasoning` (a reasoning model's grammar, from a
    response format or a required tool call, starts once the thinking ends)."""
    extra = {}
    if adapted.return_logprob:
        extra.update(return_logprob=True, top_logprobs_num=int(adapted.top_logprobs_num or 0),
                     return_text_in_logprobs=True)
    if adapted.require_reasoning:
        extra["require_reasoning"] = True
    return extra


def _response(result) -> web.Response:
    """sglang's handler result (a pydantic response, or a starlette response for its errors)."""
    if hasattr(result, "model_dump_json"):
        return web.Response(body=result.model_dump_json(by_alias=True), content_type="application/json")
    return web.Response(body=result.body, status=result.status_code, content_type="application/json")


async def serve(request: web.Request, prep, stream, outcome: Outcome, clock: FirstToken, first, metrics,
                chat) -> web.StreamResponse:
    """`first`: the stream's first delta (the caller got it, so that a failure before it keeps its own
    status); `chat`: the event loop's sglang chat class."""
    adapted, req = prep.chat
    state = openai_feed.FeedState()
    adapted.pdd_contents = openai_feed.contents(
        stream, first, "chatcmpl-" + uuid.uuid4().hex, len(prep.ids), list(prep.sampling_params.get("stop") or []),
        outcome, bool(adapted.return_logprob), whole=not req.stream, state=state, on_delta=clock.tick)
    if not req.stream:
        try:
            result = await chat._handle_non_streaming_request(adapted, req, None)
        except RequestFailed as e:
            metrics.record(outcome, False, state.tokens)
            return web.json_response({"error": {"message": str(e), "code": e.status}}, status=e.status)
        metrics.record(outcome, True, state.tokens)
        return _response(result)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    async for chunk in chat._generate_chat_stream(adapted, req, None):
        await resp.write(chunk.encode())
    metrics.record(outcome, not state.failed, state.tokens)
    return resp
