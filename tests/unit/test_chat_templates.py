"""Messages -> prompt text: the model's own template, ChatML where it has none, and tools and
tool calls written in Hermes' form for templates that know nothing of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from mlxserve.chat.templates import CHATML, TemplateError, prompt_ids, render, template_info

SMOLLM2 = (
    Path(__file__).resolve().parents[2].parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
ROUND_TRIP = [
    {"role": "user", "content": "q"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "2"},
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
]
# What a template that knows tools reads (Qwen2.5's idea, much shortened).
TOOL_TEMPLATE = (
    "{% if tools %}[tools:{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
    "{% for m in messages %}{{ m.role }}:{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.function.name }}>{% endfor %};{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
    "{{ raise_exception('only user and assistant') }}{% endif %}{{ m.content }}{% endfor %}"
)


class FakeTokenizer:
    """mlx-lm's TokenizerWrapper as far as rendering goes; one character per token."""

    def __init__(self, template: str | None, bos: int | None = None):
        self.chat_template = template
        self.has_chat_template = template is not None
        self.bos = bos
        self.eos_token_ids = {0}

    def apply_chat_template(self, messages, tools=None, tokenize=False, chat_template=None, **kw):
        template = chat_template or self.chat_template
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template, **kw)
        return rendered[0]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        lead = [self.bos] if add_special_tokens and self.bos is not None else []
        return lead + [ord(c) for c in text]


def test_a_model_without_a_template_gets_chatml():
    tokenizer = FakeTokenizer(None)
    text = render(tokenizer, [{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert template_info(tokenizer).fallback


def test_the_models_own_template_renders_and_tools_reach_it():
    tokenizer = FakeTokenizer(TOOL_TEMPLATE)
    text = render(tokenizer, ROUND_TRIP[:2], TOOLS)
    assert text == "[tools:f]user:q;assistant:<call f>;assistant:"
    assert not template_info(tokenizer).fallback


def test_developer_is_system_for_templates_without_it():
    text = render(FakeTokenizer(None), [{"role": "developer", "content": "Be brief."}])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_tools_are_described_in_the_system_message_where_the_template_has_no_tools():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]
    text = render(FakeTokenizer(None), messages, TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "f"' in system and "<tool_call>" in system


def test_a_tool_round_trip_renders_as_hermes_text_without_template_support():
    text = render(FakeTokenizer(None), ROUND_TRIP)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
        in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n"
        "</tool_response><|im_end|>" in text
    )


def test_a_strict_template_still_renders_a_tool_round_trip():
    text = render(FakeTokenizer(STRICT_TEMPLATE), ROUND_TRIP)
    assert text.endswith("<tool_response>\n3\n</tool_response>")


def test_a_template_that_refuses_the_messages_is_a_template_error():
    with pytest.raises(TemplateError, match="only user and assistant"):
        render(FakeTokenizer(STRICT_TEMPLATE), [{"role": "system", "content": "x"}])


def test_continuing_the_final_message_leaves_it_open():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]
    text = render(
        FakeTokenizer(None), messages, add_generation_prompt=False, continue_final_message=True
    )
    assert text.endswith("<|im_start|>assistant\nWell,")


def test_template_kwargs_reach_the_template():
    template = "{% if enable_thinking %}think{% else %}quiet{% endif %}"
    assert (
        render(FakeTokenizer(template), [], template_kwargs={"enable_thinking": False}) == "quiet"
    )


def test_bos_leads_once_whether_or_not_the_template_wrote_it():
    tokenizer = FakeTokenizer(None, bos=ord("^"))  # "^" stands for the BOS token's text
    assert prompt_ids(tokenizer, "ab") == [ord("^"), ord("a"), ord("b")]
    assert prompt_ids(tokenizer, "^ab") == [ord("^"), ord("a"), ord("b")]
    assert prompt_ids(FakeTokenizer(None), "ab") == [ord("a"), ord("b")]


def test_smollm2s_own_chatml_template():
    if not (SMOLLM2 / "tokenizer_config.json").exists():
        pytest.skip("SmolLM2 is not in ../shared/models")
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(SMOLLM2)
    text = render(tokenizer, [{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = prompt_ids(tokenizer, text)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert not template_info(tokenizer).fallback
    assert CHATML not in text


# A template that takes a system turn first only, as Mistral's and Gemma's do.
SYSTEM_FIRST_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('system only first') }}{% endif %}[{{ m.role }}]{{ m.content }}"
    "{% endfor %}"
)
MID_SYSTEM = [
    {"role": "system", "content": "s0"},
    {"role": "user", "content": "u1"},
    {"role": "system", "content": "agents: none"},
    {"role": "assistant", "content": "a1"},
    {"role": "system", "content": "skills: none"},
    {"role": "user", "content": "u2"},
    {"role": "system", "content": "late"},
]


def test_system_messages_anywhere_stay_system_turns_where_the_template_has_them():
    text = render(FakeTokenizer(TOOL_TEMPLATE), MID_SYSTEM, add_generation_prompt=False)
    assert text == (
        "system:s0;user:u1;system:agents: none;assistant:a1;system:skills: none;user:u2;"
        "system:late;"
    )


def test_later_system_messages_fold_into_user_turns_where_the_template_refuses_them():
    text = render(FakeTokenizer(SYSTEM_FIRST_TEMPLATE), MID_SYSTEM, add_generation_prompt=False)
    # into the next user turn; the last one, with no user turn after it, into the last user turn
    assert text == "[system]s0[user]u1[assistant]a1[user]agents: none\n\nskills: none\n\nu2\n\nlate"
    after_assistant = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    text = render(
        FakeTokenizer(SYSTEM_FIRST_TEMPLATE),
        [*after_assistant, {"role": "system", "content": "s"}],
        add_generation_prompt=False,
    )
    assert text == "[user]u[assistant]a[user]s"


def test_a_template_refusing_more_than_system_turns_still_says_why():
    with pytest.raises(TemplateError, match="only user and assistant"):
        render(FakeTokenizer(STRICT_TEMPLATE), MID_SYSTEM)
