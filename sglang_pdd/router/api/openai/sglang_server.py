"""sglang's own OpenAI chat server, run by the router over PDD's dispatcher.

An agent talks to the router as it would to sglang's server: `tools` and `tool_choice` rendered through
the model's chat template and parsed back by sglang's function-call parsers (`--tool-call-parser`),
`response_format` and `tool_choice: required` enforced with sglang's constraints, reasoning split by
sglang's reasoning parsers (`--reasoning-parser`, `separate_reasoning`), OpenAI `logprobs` and
`top_logprobs`, streaming deltas shaped as sglang shapes them. None of that is re-implemented here: the
router builds sglang's `OpenAIServingChat` once, over a stand-in for sglang's TokenizerManager
(`_Tokenizing`), and hands it what sglang's TokenizerManager would have produced for the request, from
the stitched PDD stream (`router.api.openai.feed`). What goes to the roles is sglang's own conversion of
the request (`GenerateReqInput`: prompt token IDs and sampling parameters, constraints included).

sglang reads its server configuration from a process-wide context: the router publishes a ServerArgs
for the model it serves (its tokenizer directory), with the parsers it was given, and nothing else of
sglang runs in the router (no scheduler, no model weights).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

from sglang_pdd.router.api.admission import BadRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenAIConfig:
    """The router's flags for sglang's OpenAI layer (sglang's names and meanings)."""

    model_path: str  # the model's directory (config, tokenizer, chat template): --tokenizer-path
    served_model_name: str
    tool_call_parser: str | None = None  # --tool-call-parser
    reasoning_parser: str | None = None  # --reasoning-parser
    chat_template: str | None = None  # --chat-template


def parser_names() -> tuple[list[str], list[str]]:
    """sglang's tool-call parser names and reasoning parser names."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    return sorted(FunctionCallParser.ToolCallParserEnum), sorted(ReasoningParser.DetectorMap)


def check_config(cfg: OpenAIConfig) -> None:
    """Refuse at start-up what sglang would not serve: an unknown parser, naming the flag."""
    tools, reasoning = parser_names()
    if cfg.tool_call_parser is not None and cfg.tool_call_parser not in tools:
        raise ValueError(f"--tool-call-parser {cfg.tool_call_parser!r} is not one of sglang's: {', '.join(tools)}")
    if cfg.reasoning_parser is not None and cfg.reasoning_parser not in reasoning:
        raise ValueError(f"--reasoning-parser {cfg.reasoning_parser!r} is not one of sglang's: {', '.join(reasoning)}")


class _Tokenizing:
    """What sglang's OpenAI serving classes use of the TokenizerManager: the tokenizer, the model's
    config, the server's settings, and `generate_request`, which here yields the PDD stream's contents
    that `chat.serve` attached to the request (`feed.contents`)."""

    processor = None
    request_logger = None

    def __init__(self, server_args, model_config, tokenizer, served_model_name: str):
        self.server_args, self.model_config, self.tokenizer = server_args, model_config, tokenizer
        self.served_model_name, self.model_path = served_model_name, server_args.model_path

    def config_value(self, name: str):
        return getattr(self.server_args, name, None)

    def generate_request(self, adapted_request, raw_request=None):
        return adapted_request.pdd_contents

    def create_abort_task(self, adapted_request):  # the router's dispatcher aborts the roles' copies itself
        return None


class _NoRequestLog:
    log_requests = False
    log_requests_level = 0


class SglangOpenAI:
    """sglang's chat serving class bound to the router (built once; serves every request)."""

    def __init__(self, cfg: OpenAIConfig):
        check_config(cfg)
        from sglang.srt import runtime_context
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.parser.template_manager import TemplateManager
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        args = ServerArgs(model_path=cfg.model_path, device="cpu", served_model_name=cfg.served_model_name,
                          tool_call_parser=cfg.tool_call_parser, reasoning_parser=cfg.reasoning_parser,
                          chat_template=cfg.chat_template, enable_cache_report=True,
                          incremental_streaming_output=False)
        runtime_context._CONTEXT.set_server_args(args)  # sglang's OpenAI layer reads get_serving()
        tokenizing = _Tokenizing(args, ModelConfig.from_server_args(args), get_tokenizer(cfg.model_path),
                                 cfg.served_model_name)
        tokenizing.request_logger = _NoRequestLog()
        templates = TemplateManager()
        templates.initialize_templates(tokenizer_manager=tokenizing, model_path=cfg.model_path,
                                       chat_template=cfg.chat_template, completion_template=None)
        self.cfg, self.tokenizer = cfg, tokenizing.tokenizer
        self.kept_stop_ids = kept_stop_ids(cfg.tool_call_parser, self.tokenizer)
        self._args, self._model_config, self._templates = args, tokenizing.model_config, templates
        self.chat = OpenAIServingChat(tokenizing, templates)  # the event loop's: builds the responses
        logger.info("OpenAI chat through sglang's serving layer (tool-call parser %s, reasoning parser %s)",
                    cfg.tool_call_parser, cfg.reasoning_parser)

    def chat_for_thread(self):
        """sglang's chat class over a tokenizer of its own, for one of the router's tokenizer threads (a
        fast tokenizer is not safe to share between threads)."""
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

        tokenizing = _Tokenizing(self._args, self._model_config, copy.deepcopy(self.tokenizer),
                                 self.cfg.served_model_name)
        tokenizing.request_logger = _NoRequestLog()
        return OpenAIServingChat(tokenizing, self._templates)


GPT_OSS_CALL = 200012  # gpt-oss's <|call|>: a stop token that closes a tool call (sglang's detokenizer names it so)


def kept_stop_ids(tool_call_parser: str | None, tokenizer) -> frozenset[int]:
    """The stop tokens sglang's detokenizer leaves in a request's text for this tool parser (they close a
    tool call: without them the call reads as cut off); the router's text does the same (`request_text`)."""
    from sglang.srt.parser.response_template import tool_close_token_ids

    kept = set(tool_close_token_ids(tool_call_parser, tokenizer))
    if tool_call_parser == "gpt-oss":
        kept.add(GPT_OSS_CALL)
    return frozenset(kept)


MAX_TOP_LOGPROBS = 20  # OpenAI's bound


def convert(chat, body: dict):
    """The client's chat body as sglang's server converts it: (GenerateReqInput, ChatCompletionRequest);
    raises BadRequest with sglang's own message for what sglang's server answers 400."""
    from fastapi import HTTPException
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "the body"
        raise BadRequest(f"{where}: {first.get('msg')}") from None
    error = chat._validate_request(request)
    if error:
        raise BadRequest(error)
    if request.top_logprobs is not None and not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
        # sglang sets no bound; each row rides with every token through the router (OpenAI's is 20)
        raise BadRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {request.top_logprobs}")
    try:
        return chat._convert_to_internal_request(request, None)
    except HTTPException as e:
        raise BadRequest(str(e.detail)) from None
    except (ValueError, TypeError, KeyError) as e:  # what sglang's handle_request answers 400 for
        raise BadRequest(str(e) or type(e).__name__) from None


LIFTED = ("logprobs", "top_logprobs")  # `admission.NOT_YET` keys sglang's chat layer serves through the router
