"""The tiny model speaks tools (Qwen2.5's format) and reasoning (<think>): its chat template renders a
conversation with tools the way sglang's `qwen25` detector and `qwen3` / `deepseek-r1` reasoning parsers
read it back, through the tokenizer and sglang's detokenization (`skip_special_tokens`)."""

import json

import pytest

pytest.importorskip("sglang")

from sglang.srt.entrypoints.openai.protocol import Tool  # noqa: E402
from sglang.srt.function_call.qwen25_detector import Qwen25Detector  # noqa: E402
from sglang.srt.parser.reasoning_parser import ReasoningParser  # noqa: E402

from sglang_pdd.lab.testing import tiny_model  # noqa: E402
from sglang_pdd.lab.testing.chat_templates import CHAT_TEMPLATE, MARKUP_TOKENS  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "list_files", "description": "List the files of a directory",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL = {"id": "call-1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "/srv"}'}}
CONVERSATION = [
    {"role": "system", "content": "You are a terse agent."},
    {"role": "user", "content": "What is in /srv?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call-1", "content": "a.txt b.txt"},
    {"role": "assistant", "content": "Two files.", "reasoning_content": "The tool listed two."},
    {"role": "user", "content": "Thanks."},
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The tiny model's tokenizer as `build` saves it (the tokenizer alone: no weights needed)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=tiny_model.build_tokenizer(tiny_model.TinyModelSpec()), bos_token="<s>",
        eos_token="</s>", unk_token="<unk>", additional_special_tokens=tiny_model.SPECIAL_TOKENS[3:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def detokenized(tok, text: str) -> str:
    """`text` as the model's output comes back from sglang: token IDs, then decoded without specials."""
    return tok.decode(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id], skip_special_tokens=True)


def test_markers_are_single_tokens_kept_in_decoded_text(hf_tokenizer):
    tok = hf_tokenizer
    for marker in MARKUP_TOKENS:
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
        assert tok.convert_tokens_to_ids(marker) < len(tiny_model.RESERVED_TOKENS)  # never a greedy choice
    assert not set(tok.convert_tokens_to_ids(MARKUP_TOKENS)) & set(tok.all_special_ids)
    assert detokenized(tok, "<think>x</think><tool_call>\n{}\n</tool_call>") == "<think>x</think><tool_call>\n{}\n</tool_call>"
    assert tok.decode(tok.encode("<|user|>\nhi</s>", add_special_tokens=False), skip_special_tokens=True) == "\nhi"


def test_tools_render_in_the_system_message_and_calls_and_results_in_qwen25_form(hf_tokenizer):
    text = hf_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    system = text.split("</s>")[0]
    assert system.startswith("<s><|system|>\nYou are a terse agent.\n\n# Tools\n")
    tools_block = system.split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in tools_block.splitlines()] == TOOLS
    assert "<|assistant|>\n<tool_call>\n{\"name\": \"list_files\", \"arguments\": {\"path\": \"/srv\"}}\n</tool_call></s>" in text
    assert "<|tool|>\n<tool_response>\na.txt b.txt\n</tool_response></s>" in text
    assert "<|assistant|>\n<think>\nThe tool listed two.\n</think>\n\nTwo files.</s>" in text
    assert text.endswith("<|user|>\nThanks.</s>\n<|assistant|>\n")
    # without tools, the plain form
    plain = hf_tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert plain == "<s><|system|>\nYou are a terse agent.</s>\n<|user|>\nWhat is in /srv?</s>\n<|assistant|>\n"


def test_qwen25_detector_parses_a_tool_call_written_in_the_template_s_format(hf_tokenizer):
    rendered = hf_tokenizer.apply_chat_template(CONVERSATION[:3], tools=TOOLS, tokenize=False)
    reply = rendered.split("<|assistant|>\n")[1].split("</s>")[0]  # how the template writes a call
    tools = [Tool(**t) for t in TOOLS]
    for output in (reply, "Let me look.\n" + reply):
        got = Qwen25Detector().detect_and_parse(detokenized(hf_tokenizer, output), tools)
        assert [(c.name, json.loads(c.parameters)) for c in got.calls] == [("list_files", {"path": "/srv"})]
    assert got.normal_text == "Let me look."


def test_the_detector_would_see_nothing_were_the_markers_special(hf_tokenizer):
    """The control: as special tokens, the markers vanish in sglang's detokenization and no call is found."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    d = json.loads(hf_tokenizer.backend_tokenizer.to_str())
    for t in d["added_tokens"]:
        t["special"] = t["special"] or t["content"] in MARKUP_TOKENS
    special = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(d)), eos_token="</s>")
    reply = '<tool_call>\n{"name": "list_files", "arguments": {"path": "/srv"}}\n</tool_call>'
    assert Qwen25Detector().detect_and_parse(detokenized(special, reply), [Tool(**t) for t in TOOLS]).calls == []


@pytest.mark.parametrize("parser", ["qwen3", "deepseek-r1"])
def test_reasoning_parsers_split_the_think_block(hf_tokenizer, parser):
    prompt = hf_tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True,
                                              enable_thinking=True)
    assert prompt.endswith("<|assistant|>\n<think>\n")  # the reply opens in reasoning, as Qwen3's and R1's
    output = detokenized(hf_tokenizer, "<think>\nListing first.\n</think>\n\nTwo files.")
    reasoning, content = ReasoningParser(parser, stream_reasoning=False).parse_non_stream(output)
    assert (reasoning.strip(), content.strip()) == ("Listing first.", "Two files.")


def test_the_model_is_rebuilt_when_its_template_or_markers_change(monkeypatch):
    before = tiny_model.TinyModelSpec().fingerprint()
    monkeypatch.setattr(tiny_model, "CHAT_TEMPLATE", CHAT_TEMPLATE + "{# changed #}")
    assert tiny_model.TinyModelSpec().fingerprint() != before
    monkeypatch.undo()
    monkeypatch.setattr(tiny_model, "RESERVED_TOKENS", tiny_model.RESERVED_TOKENS + ["<extra>"])
    assert tiny_model.TinyModelSpec().fingerprint() != before
