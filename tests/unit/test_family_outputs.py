"""Each family's own output read back: raw model text -> content, reasoning and calls, whole and
streamed in small pieces. The cases are the facts of the peers' public parser tests (vLLM's
tests/tool_parsers/, llama.cpp's tests/test-chat.cpp, SGLang's gpt-oss parser tests): the
formats as the models write them, restated here as data, not their code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxserve.chat.output import AnswerSplitter, Delta, OutputSpec, split_answer
from mlxserve.chat.tool_calls import syntax_for
from mlxserve.families import FAMILIES, output_format

TEMPLATES = Path(__file__).resolve().parents[2].parent / "shared" / "chat-templates"
WEATHER = {"location": "Paris"}
HARMONY = OutputSpec(harmony=True)


def spec(parser: str | None = None, **fields) -> OutputSpec:
    tools = syntax_for(None, [], parser) if parser else None
    return OutputSpec(tools=tools, **fields)


# (name, spec, raw text, expected content, expected reasoning, expected calls [(name, args)])
CASES = [
    # gpt-oss's harmony (the generation prompt ends `<|start|>assistant`)
    (
        "harmony: analysis, then final",
        HARMONY,
        "<|channel|>analysis<|message|>The user asks about Paris.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Paris is mild today.",
        "Paris is mild today.",
        "The user asks about Paris.",
        [],
    ),
    (
        "harmony: a call on the commentary channel, constrained to json",
        HARMONY,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":'
        '"Paris"}<|call|>',
        "",
        "Need the weather.",
        [("get_weather", WEATHER)],
    ),
    (
        "harmony: the recipient before the channel, bare json",
        HARMONY,
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"location": "Paris"}'
        "<|call|>",
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "harmony: a call on the analysis channel (gpt-oss writes them there too)",
        HARMONY,
        '<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{"location":'
        '"Paris"}<|call|>',
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "harmony: a preamble on the commentary channel is content",
        HARMONY,
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather<|message|>{"location":"Paris"}<|call|>',
        "Let me check.",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "harmony: final ended by <|return|>",
        HARMONY,
        "<|channel|>final<|message|>Done.<|return|>",
        "Done.",
        "",
        [],
    ),
    (
        "harmony: reasoning cut by max_tokens",
        HARMONY,
        "<|channel|>analysis<|message|>The user asks",
        "",
        "The user asks",
        [],
    ),
    ("harmony: a model that writes none of it", HARMONY, "Just text.", "Just text.", "", []),
    # Ministral 3 / Magistral
    (
        "[THINK] then a [TOOL_CALLS] call",
        spec("mistral", think=("[THINK]", "[/THINK]")),
        '[THINK]Weather needed.[/THINK][TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}',
        "",
        "Weather needed.",
        [("get_weather", WEATHER)],
    ),
    (
        "[THINK] then content",
        spec(think=("[THINK]", "[/THINK]")),
        "[THINK]Short.[/THINK]Paris is mild.",
        "Paris is mild.",
        "Short.",
        [],
    ),
    (
        "Seed-OSS's <seed:think>",
        spec(think=("<seed:think>", "</seed:think>")),
        "<seed:think>Short.</seed:think>Paris is mild.",
        "Paris is mild.",
        "Short.",
        [],
    ),
    # DeepSeek V3.1, and V3's older form
    (
        "deepseek v3.1: text, then two calls",
        spec("deepseek_v31"),
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"location": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Checking.",
        "",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "deepseek v3: function<｜tool▁sep｜>NAME and a json block",
        spec("deepseek_v31"),
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"location": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "deepseek: a malformed call stays text",
        spec("deepseek_v31"),
        "<｜tool▁calls▁begin｜>nonsense<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜>nonsense<｜tool▁calls▁end｜>",
        "",
        [],
    ),
    # the syntaxes mlx-lm parses, read through the same splitter
    (
        "hermes, after <think>",
        spec("hermes", think=("<think>", "</think>")),
        '<think>Weather.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"location": "Paris"}}\n</tool_call>',
        "",
        "Weather.",
        [("get_weather", WEATHER)],
    ),
    (
        "qwen3_coder's XML",
        spec("qwen3_coder"),
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        "Sure.\n",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "llama 3's bare JSON",
        OutputSpec(json_calls=True),
        '{"name": "get_weather", "parameters": {"location": "Paris"}}',
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "llama 3's <|python_tag|>",
        OutputSpec(json_calls=True),
        '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris"}}',
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "glm47's arg keys",
        spec("glm47"),
        "<tool_call>get_weather<arg_key>location</arg_key><arg_value>Paris</arg_value></tool_call>",
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "kimi_k2's sections",
        spec("kimi_k2"),
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"location": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "minimax_m2's invoke",
        spec("minimax_m2"),
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="location">Paris'
        "</parameter>\n</invoke>\n</minimax:tool_call>",
        "",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "gemma4's call:",
        spec("gemma4"),
        '<|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>',
        "",
        "",
        [("get_weather", WEATHER)],
    ),
]


def calls_of(delta: Delta) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in delta.calls]


def streamed(output: OutputSpec, text: str, size: int) -> Delta:
    splitter, whole = AnswerSplitter(output), Delta()
    for at in range(0, len(text), size):
        whole.add(splitter.feed(text[at : at + size]))
    whole.add(splitter.finish())
    return whole


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("pieces", [None, 1, 3, 7])
def test_each_familys_output_is_read_back(case, pieces):
    _, output, text, content, reasoning, calls = case
    got = split_answer(output, text) if pieces is None else streamed(output, text, pieces)
    assert (got.content, got.reasoning.strip(), calls_of(got)) == (content, reasoning, calls)


@pytest.mark.skipif(not TEMPLATES.is_dir(), reason=f"no shared chat templates at {TEMPLATES}")
@pytest.mark.parametrize(
    "template, expected",
    [
        ("openai-gpt-oss-120b.jinja", "harmony"),
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral reasoning"),
        ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek calls"),
        ("Qwen-Qwen3-0.6B.jinja", None),
        ("Qwen3-Coder.jinja", None),
        ("Qwen3.5-4B.jinja", None),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", None),
        ("GLM-4.6.jinja", None),
        ("Kimi-K2-Thinking.jinja", None),
    ],
)
def test_a_real_template_tells_its_familys_own_format(template, expected):
    found = output_format((TEMPLATES / template).read_text())
    assert (found.name if found else None) == expected


def test_a_template_with_seed_think_reads_it_as_reasoning():
    found = output_format("{{ '<seed:think>' }}{{ content }}{{ '</seed:think>' }}")
    assert found is not None and found.think == ("<seed:think>", "</seed:think>")


def test_every_family_names_a_format_that_exists():
    from mlxserve.chat.tool_calls import OWN_SYNTAXES
    from mlxserve.families import OUTPUT_FORMATS

    names = {f.name for f in OUTPUT_FORMATS}
    assert all(f.output in names for f in FAMILIES if f.output)
    # (families.py is plain data: the parsers it names by name are ours)
    assert all(f.tool_syntax in OWN_SYNTAXES for f in OUTPUT_FORMATS if f.tool_syntax)


@pytest.mark.skipif(not TEMPLATES.is_dir(), reason=f"no shared chat templates at {TEMPLATES}")
def test_reasoning_sent_back_reaches_gpt_oss_and_qwen3_templates(tiny_model):
    """An assistant turn's reasoning and call, sent back with its tool's result: gpt-oss's
    template renders it on the analysis channel before the call, Qwen3's in <think>."""
    from mlx_lm.tokenizer_utils import load

    from mlxserve.chat.templates import render
    from mlxserve.planning.messages import Call, Message

    history = [
        Message("user", "What is the weather like in Paris today?"),
        Message(
            "assistant",
            "",
            tool_calls=(Call("get_weather", {"location": "Paris"}, "call_1"),),
            reasoning_content="Need the weather tool.",
        ),
        Message("tool", "Mild, 18C.", tool_call_id="call_1"),
    ]
    tokenizer = load(Path(tiny_model))
    messages = [m.for_template() for m in history]
    harmony = render(
        tokenizer, messages, override=(TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    )
    assert "<|channel|>analysis<|message|>Need the weather tool.<|end|>" in harmony
    assert "to=functions.get_weather" in harmony
    qwen3 = render(tokenizer, messages, override=(TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    assert "<think>\nNeed the weather tool.\n</think>" in qwen3
