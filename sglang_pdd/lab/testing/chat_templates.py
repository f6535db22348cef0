"""The tiny model's chat template: Qwen2.5's tool-calling format, and Qwen3 / DeepSeek-R1's <think>.

sglang's parsers read text: the `qwen25` tool-call detector looks for `<tool_call>\\n{json}\\n</tool_call>`,
the `qwen3` and `deepseek-r1` reasoning parsers for `<think>` ... `</think>`. As in Qwen's tokenizers,
these markers are single added tokens that are *not* special (`MARKUP_TOKENS`), so sglang's detokenizer
(`skip_special_tokens`) keeps them in the text its parsers see; the role markers and EOS stay special.

The template follows Qwen2.5's: the tools, one JSON object per line inside `<tools></tools>`, in the
system message with the instruction to answer with `<tool_call>`; an assistant message's `tool_calls`
as `<tool_call>` blocks; tool results as `<tool_response>` blocks in one tool turn. One template
serves both parsers: `enable_thinking` (a chat template kwarg, as Qwen3's) opens the reply with
`<think>\\n`, and an assistant message's `reasoning_content` is rendered inside `<think></think>`.
"""

from __future__ import annotations

import json

MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

TOOLS_PREAMBLE = (
    "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTION = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)

NL = "{{ '\\n' }}"  # a newline right after a block tag (HF renders with trim_blocks, which eats a literal one)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}"
    + NL + TOOLS_PREAMBLE + "{% for tool in tools %}" + NL + "{{ tool | tojson }}{% endfor %}"
    + NL + TOOLS_INSTRUCTION + "</s>\n"
    "{% elif messages[0]['role'] == 'system' %}<|system|>\n{{ messages[0]['content'] }}</s>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and loop.first %}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n"
    "{% if m.get('reasoning_content') %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% for call in m.get('tool_calls') or [] %}"
    "{% set f = call['function'] if call.get('function') else call %}"
    "{% if m['content'] or not loop.first %}" + NL + "{% endif %}"
    "<tool_call>\n{\"name\": \"{{ f['name'] }}\", \"arguments\": "
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}</s>\n"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|tool|>{% endif %}"
    + NL + "<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}</s>\n{% endif %}"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def with_plain_markup(tokenizer):
    """`tokenizer` (a `tokenizers.Tokenizer` trained with MARKUP_TOKENS among its special tokens) with
    those markers made plain added tokens: still one token each, never split, but kept in decoded text."""
    from tokenizers import Tokenizer

    d = json.loads(tokenizer.to_str())
    for t in d["added_tokens"]:
        if t["content"] in MARKUP_TOKENS:
            t["special"] = False
    return Tokenizer.from_str(json.dumps(d))
