"""The answer split into content, reasoning and tool calls: streamed piece by piece it must give
what the whole text gives, and no tag may leak into content."""

from __future__ import annotations

import json

import pytest

from mlxserve.chat.output import THINK_TAGS, AnswerSplitter, Delta, OutputSpec, split_answer
from mlxserve.chat.tool_calls import (
    HERMES_SYNTAX,
    ToolSyntax,
    forced_call_grammar,
    forced_call_schema,
    parse_json_calls,
    syntax_for,
)
from mlxserve.chat.tool_prompt import CALL_END, CALL_START

HERMES = ToolSyntax(CALL_START, CALL_END, parse_json_calls)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def streamed(spec: OutputSpec, text: str, cuts: list[int]) -> Delta:
    splitter, out, start = AnswerSplitter(spec), Delta(), 0
    for cut in [*cuts, len(text)]:
        out.add(splitter.feed(text[start:cut]))
        start = cut
    out.add(splitter.finish())
    return out


def same_answer(a: Delta, b: Delta) -> bool:
    names = [(c.name, c.arguments) for c in a.calls] == [(c.name, c.arguments) for c in b.calls]
    return a.content == b.content and a.reasoning == b.reasoning and names


CASES = {
    "plain": (OutputSpec(), " Hello there", " Hello there", "", []),
    "think": (
        OutputSpec(think=THINK_TAGS),
        "<think>\nhmm, ok\n</think>\n\nYes.",
        "Yes.",
        "hmm, ok",
        [],
    ),
    "think opened by the prompt": (
        OutputSpec(think=THINK_TAGS, thinking_open=True),
        "so 2</think>\n4",
        "4",
        "so 2",
        [],
    ),
    "think off": (OutputSpec(), "<think>a</think>b", "<think>a</think>b", "", []),
    "tag later is content": (OutputSpec(think=THINK_TAGS), "a <think>b", "a <think>b", "", []),
    "hermes call": (
        OutputSpec(think=THINK_TAGS, tools=HERMES, json_calls=True),
        "Let me check. " + CALL,
        "Let me check. ",
        "",
        [("get_weather", '{"city": "Oslo"}')],
    ),
    "think then call": (
        OutputSpec(think=THINK_TAGS, tools=HERMES, json_calls=True),
        "<think>weather</think>\n" + CALL + CALL,
        "",
        "weather",
        [("get_weather", '{"city": "Oslo"}')] * 2,
    ),
    "bare json call": (
        OutputSpec(tools=HERMES, json_calls=True),
        '<|python_tag|>{"name": "f", "parameters": {"x": 1}}',
        "",
        "",
        [("f", '{"x": 1}')],
    ),
    "json that is no call": (
        OutputSpec(tools=HERMES, json_calls=True),
        '{"answer": 4}',
        '{"answer": 4}',
        "",
        [],
    ),
    "unfinished call stays text": (
        OutputSpec(tools=HERMES, json_calls=True),
        'ok <tool_call>\n{"name": "f", "argu',
        'ok <tool_call>\n{"name": "f", "argu',
        "",
        [],
    ),
    "forced calls in the model's syntax: the separators are no content": (
        OutputSpec(tools=HERMES, forced=True),
        CALL + "\n" + CALL.replace("Oslo", "Paris"),
        "",
        "",
        [("get_weather", '{"city": "Oslo"}'), ("get_weather", '{"city": "Paris"}')],
    ),
    "a forced call cut by max_tokens is the call as far as it was written, no content": (
        OutputSpec(tools=HERMES, forced=True),
        CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UT',
        "",
        "",
        [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"zone": "UT')],
    ),
    "a bare forced list cut inside its second call": (
        OutputSpec(forced=True),
        '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [',
        "",
        "",
        [("a", '{"x": 1}'), ("b", '{"y": [')],
    ),
    "a forced call cut before its name is none": (
        OutputSpec(tools=HERMES, forced=True),
        '<tool_call>\n{"nam',
        "",
        "",
        [],
    ),
    "forced list, one call allowed": (
        OutputSpec(forced=True, max_calls=1),
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]',
        "",
        "",
        [("a", "{}")],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_whole_answers_split_as_expected(case):
    spec, text, content, reasoning, calls = CASES[case]
    answer = split_answer(spec, text)
    assert answer.content == content
    assert answer.reasoning == reasoning
    assert [(c.name, c.arguments) for c in answer.calls] == calls


@pytest.mark.parametrize("case", list(CASES))
def test_streaming_any_split_gives_the_whole_answer(case):
    spec, text, *_ = CASES[case]
    whole = split_answer(spec, text)
    for cut in range(len(text) + 1):
        assert same_answer(streamed(spec, text, [cut]), whole), cut
    assert same_answer(streamed(spec, text, list(range(1, len(text)))), whole)


def test_content_is_released_as_it_comes_except_a_possible_tag():
    splitter = AnswerSplitter(OutputSpec(tools=HERMES))
    assert splitter.feed("Hello").content == "Hello"
    assert splitter.feed(" <tool").content == " "
    assert splitter.feed("box>").content == "<toolbox>"


def test_a_streamed_call_arrives_whole_once_its_end_tag_does():
    splitter = AnswerSplitter(OutputSpec(tools=HERMES))
    assert not splitter.feed(CALL[:-3])
    (call,) = splitter.feed(CALL[-3:]).calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    assert call.id.startswith("call_")


def test_calls_given_as_argument_strings_are_read():
    (call,) = parse_json_calls('{"name": "f", "arguments": "{\\"a\\": [1]}"}')
    assert json.loads(call.arguments) == {"a": [1]}


@pytest.mark.parametrize("text", ["", "[]", '{"arguments": {}}', '{"name": "f", "arguments": 3}'])
def test_what_is_not_a_call_is_refused(text):
    with pytest.raises(ValueError):
        parse_json_calls(text)


class _WithParser:
    """A tokenizer as mlx-lm wraps one whose template it has a parser for."""

    tool_call_start, tool_call_end = "[TOOL_CALLS]", ""

    @staticmethod
    def tool_parser(text, tools):
        from mlx_lm.tool_parsers.mistral import parse_tool_call

        return parse_tool_call(text, tools)


def test_mlx_lm_parsers_are_used_where_the_model_has_one():
    syntax = syntax_for(_WithParser(), None)
    spec = OutputSpec(tools=syntax, json_calls=True)
    answer = split_answer(spec, '[TOOL_CALLS][{"name": "f", "arguments": {"q": "x"}}]')
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [("f", {"q": "x"})]
    assert syntax_for(object(), None).start == CALL_START


def test_a_forced_call_schema_names_the_tool_and_its_parameters():
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b"}},
    ]
    one = forced_call_schema(tools[:1], one=True)
    assert one["properties"]["name"] == {"const": "a"}
    many = forced_call_schema(tools, one=False)
    assert many["type"] == "array" and many["minItems"] == 1
    assert [c["properties"]["name"]["const"] for c in many["items"]["anyOf"]] == ["a", "b"]


@pytest.mark.parametrize("one", [True, False], ids=["one call", "several"])
def test_a_forced_call_grammar_writes_calls_the_hermes_way(one):
    """The grammar llguidance gets for a forced call in Hermes' syntax compiles (what it lets the
    model write is tested on a served model, tests/api/test_chat.py)."""
    import llguidance

    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    grammar = llguidance.grammar_from("lark", forced_call_grammar(tools, one, HERMES_SYNTAX))
    error = llguidance.LLMatcher.validate_grammar(grammar)
    assert not error, error
    assert HERMES_SYNTAX.json_body and syntax_for(object(), None) is HERMES_SYNTAX
