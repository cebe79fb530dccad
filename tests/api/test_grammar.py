"""Grammar masking through the API: every dialect's constraint, on the random-weight tiny model.

The tiny model has no idea what JSON is, so whatever it writes under a constraint is the mask's
doing. Twenty seeds per grammar run as one request with n=20 (choice j uses seed + j).
"""

from __future__ import annotations

import json
import re
import threading

import httpx
import jsonschema
import pytest

from ..conftest import SLOW_TEST_TIMEOUT_S
from ..helpers import BatchSizes, complete, stream_chunks, streamed_texts, texts

SEEDS = 20
REAL_SEEDS = 20  # SmolLM2's batch
# pytest-timeout's bound for a batch of SEEDS up to a thousand grammar-masked steps (a slow VM
# took minutes when two passes shared its cores: docs/benchmarks.md, "Slow machines")
BATCH_TIMEOUT_S = 900
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "owner": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 5},
                    "maxItems": 3,
                },
            },
            "required": ["id", "tags"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "owner"],
    "additionalProperties": False,
}
ISO_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
ARITHMETIC_GBNF = r"""
root ::= expr
expr ::= term (op term)*
term ::= num | "(" expr ")"
op ::= "+" | "-" | "*" | "/"
num ::= [0-9]+
"""
WORDS_LARK = r"""
start: word ("," word)*
word: /[a-z]{1,6}/
"""
COLORS = ["red", "green", "blue"]


def is_arithmetic(text: str) -> bool:
    """Recursive descent over ARITHMETIC_GBNF's language."""
    pos = 0

    def term() -> bool:
        nonlocal pos
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        start = pos
        while pos < len(text) and text[pos].isdigit():
            pos += 1
        return pos > start

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while pos < len(text) and text[pos] in "+-*/":
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(text)


def validates(schema):
    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    return check


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


CASES = {
    "json_schema": ({"json_schema": PERSON}, 400, validates(PERSON)),
    "json_object": ({"response_format": {"type": "json_object"}}, 1000, is_json_object),
    "regex": ({"guided_regex": ISO_DATE}, 40, lambda t: re.fullmatch(ISO_DATE, t) is not None),
    "gbnf": ({"grammar": ARITHMETIC_GBNF}, 400, is_arithmetic),
    "lark": (
        {"grammar": {"type": "lark", "value": WORDS_LARK}},
        400,
        lambda t: re.fullmatch(r"[a-z]{1,6}(,[a-z]{1,6})*", t) is not None,
    ),
    "choice": ({"guided_choice": COLORS}, 20, lambda t: t in COLORS),
}


def finished_outputs(result: dict) -> tuple[list[str], int]:
    """Texts of the choices that finished with `stop`, and how many ran out of tokens."""
    stopped = [c["text"] for c in result["choices"] if c["finish_reason"] == "stop"]
    return stopped, len(result["choices"]) - len(stopped)


@pytest.mark.timeout(BATCH_TIMEOUT_S)
@pytest.mark.parametrize("case", list(CASES))
def test_twenty_seeds_follow_the_grammar_and_finish(http, case):
    constraint, max_tokens, valid = CASES[case]
    http.timeout = httpx.Timeout(BATCH_TIMEOUT_S)  # this test's client, as long as its bound
    result = complete(http, prompt="x", n=SEEDS, seed=7, max_tokens=max_tokens, **constraint)
    stopped, cut = finished_outputs(result)
    bad = [t for t in stopped if not valid(t)]
    assert not bad, bad
    assert len(stopped) >= 15, f"only {len(stopped)} of {SEEDS} finished; {cut} hit max_tokens"


# Each dialect's spelling of a constraint, and what its output must satisfy.
DIALECTS = {
    "mistral regex": ({"grammar": {"type": "regex", "value": "(ab)+c"}}, r"(ab)+c"),
    "mistral json_schema": (
        {"grammar": {"type": "json_schema", "value": {"enum": ["on", "off"]}}},
        r'"(on|off)"',
    ),
    "mistral llguidance": (
        {
            "grammar": {
                "type": "llguidance",
                "value": {"grammars": [{"lark_grammar": 'start: "ok"'}]},
            }
        },
        "ok",
    ),
    "llama.cpp gbnf": ({"grammar": 'root ::= "yes" | "no"'}, "yes|no"),
    "openai json_schema": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "flag", "schema": {"type": "boolean"}, "strict": True},
            }
        },
        "true|false",
    ),
    "fireworks json_object + schema": (
        {
            "response_format": {
                "type": "json_object",
                "schema": {"type": "integer", "minimum": 0, "maximum": 9},
            }
        },
        "[0-9]",
    ),
    "vllm guided_json string": ({"guided_json": '{"const": 42}'}, "42"),
    "vllm guided_grammar": ({"guided_grammar": 'root ::= "a" "b"?'}, "ab?"),
    "vllm structured_outputs": ({"structured_outputs": {"regex": "x{3}"}}, "xxx"),
}


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_dialect_constrains_output(http, dialect):
    constraint, pattern = DIALECTS[dialect]
    result = complete(http, prompt="x", n=4, seed=1, max_tokens=256, **constraint)
    for choice in result["choices"]:
        assert choice["finish_reason"] == "stop"
        assert re.fullmatch(pattern, choice["text"]), choice["text"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"utc": {"type": "boolean"}},
                "required": ["utc"],
                "additionalProperties": False,
            },
        },
    },
]


def test_a_forced_tool_call_follows_that_tools_schema(http):
    choice = {"type": "function", "function": {"name": "get_time"}}
    result = complete(http, prompt="x", n=5, seed=3, max_tokens=64, tools=TOOLS, tool_choice=choice)
    for text in texts(result):
        call = json.loads(text)
        assert call["name"] == "get_time" and isinstance(call["arguments"]["utc"], bool)


def test_required_tool_choice_calls_one_of_the_tools(http):
    result = complete(
        http, prompt="x", n=8, seed=3, max_tokens=64, tools=TOOLS, tool_choice="required"
    )
    for text in texts(result):
        call = json.loads(text)
        schema = next(t for t in TOOLS if t["function"]["name"] == call["name"])["function"]
        jsonschema.validate(call["arguments"], schema["parameters"])


def test_tool_choice_none_leaves_output_free(http):
    result = complete(
        http, prompt="x", seed=3, max_tokens=8, tools=TOOLS, tool_choice="none", ignore_eos=True
    )
    free = complete(http, prompt="x", seed=3, max_tokens=8, ignore_eos=True)
    assert texts(result) == texts(free)


@pytest.mark.parametrize(
    ("body", "param", "reason"),
    [
        ({"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
        ({"grammar": "root ::= undefined_rule"}, "grammar", "undefined_rule"),
        ({"json_schema": {"type": "no-such-type"}}, "json_schema", "no-such-type"),
        ({"grammar": {"type": "lark", "value": "start: ("}}, "grammar", ""),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
    ],
)
def test_an_invalid_constraint_is_a_400_with_the_compilers_reason(http, body, param, reason):
    response = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert reason in error["message"]


def test_two_constraints_at_once_are_a_400_naming_both(http):
    response = http.post(
        "/v1/completions",
        json={"prompt": "x", "guided_regex": "a", "response_format": {"type": "json_object"}},
    )
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "response_format" in message and "guided_regex" in message


def test_off_values_are_not_constraints(http):
    result = complete(
        http,
        prompt="x",
        seed=5,
        max_tokens=6,
        ignore_eos=True,
        grammar="",
        response_format={"type": "text"},
        tools=[],
        tool_choice="auto",
    )
    free = complete(http, prompt="x", seed=5, max_tokens=6, ignore_eos=True)
    assert texts(result) == texts(free)


def test_max_tokens_cuts_a_grammar_with_length(http):
    result = complete(http, prompt="x", seed=1, max_tokens=3, json_schema=PERSON)
    assert result["choices"][0]["finish_reason"] == "length"


def test_streaming_follows_the_grammar(http):
    chunks = stream_chunks(http, prompt="x", n=4, seed=2, max_tokens=400, json_schema=PERSON)
    finishes = {
        c["index"]: c["finish_reason"]
        for chunk in chunks
        if isinstance(chunk, dict)
        for c in chunk["choices"]
        if c["finish_reason"]
    }
    for index, text in streamed_texts(chunks).items():
        if finishes[index] == "stop":
            jsonschema.validate(json.loads(text), PERSON)


def test_logprobs_are_those_of_the_masked_distribution(http):
    result = complete(
        http, prompt="x", seed=4, max_tokens=8, guided_choice=["red", "blue"], logprobs=5
    )
    logprobs = result["choices"][0]["logprobs"]
    for alternatives in logprobs["top_logprobs"][:1]:
        for token in alternatives:  # the first token can only start "red" or "blue"
            assert "red".startswith(token) or "blue".startswith(token), alternatives


def test_stop_strings_still_apply(http):
    result = complete(
        http, prompt="x", seed=1, max_tokens=40, guided_regex="abc(d|e)fg", stop=["d", "e"]
    )
    choice = result["choices"][0]
    assert choice["text"] == "abc" and choice["finish_reason"] == "stop"


def test_constrained_and_free_sequences_share_a_batch(server, http):
    solo = complete(http, prompt="x", seed=9, max_tokens=24, ignore_eos=True)
    results: dict[str, dict] = {}

    def run(name: str, **body):
        results[name] = complete(http, prompt="x", **body)

    threads = [
        threading.Thread(
            target=run, args=("free",), kwargs=dict(seed=9, max_tokens=24, ignore_eos=True)
        ),
        threading.Thread(
            target=run, args=("json",), kwargs=dict(seed=9, n=8, max_tokens=400, json_schema=PERSON)
        ),
    ]
    with BatchSizes(server.engine) as batch:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert texts(results["free"]) == texts(solo)
    stopped, _ = finished_outputs(results["json"])
    for text in stopped:
        jsonschema.validate(json.loads(text), PERSON)
    assert batch.largest >= 2, batch.largest


def test_compiled_grammars_are_cached(server, http):
    compiler = server.engine.loaded.grammars
    complete(http, prompt="x", max_tokens=4, guided_regex="[a-c]{2}z")
    grammar = compiler._texts[("regex", "[a-c]{2}z")]
    prototype = compiler._prototypes[grammar]
    complete(http, prompt="x", max_tokens=4, guided_regex="[a-c]{2}z")
    assert compiler._prototypes[grammar] is prototype  # not compiled again


@pytest.mark.slow
def test_a_real_model_follows_a_schema(smollm2_server):
    with httpx.Client(base_url=smollm2_server.url, timeout=SLOW_TEST_TIMEOUT_S) as http:
        result = complete(
            http,
            prompt="A pet record as JSON:\n",
            n=REAL_SEEDS,
            seed=11,
            max_tokens=120,
            temperature=0.8,
            json_schema=PERSON,
        )
    stopped, cut = finished_outputs(result)
    for text in stopped:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(stopped) >= REAL_SEEDS - 2, f"{cut} of {REAL_SEEDS} hit max_tokens"
