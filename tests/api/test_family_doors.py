"""Each family's own output through every chat door, streamed and not, with the official
clients: tiny models trained to answer in the family's own words (tests/family_models.py) under
its real chat template and special tokens: gpt-oss's harmony, Qwen3's `<think>` and Hermes
calls, Qwen3-Coder's XML calls, Ministral 3's `[THINK]` and `[TOOL_CALLS]`. Reasoning comes back
as each protocol's reasoning, the rest as content, a call as a tool call, and the family's stop
tokens end the answer."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from ..family_models import (
    CALL_REASONING,
    CONTENT,
    QUESTION,
    REASONING,
    TEMPLATES,
    TRAINED_FAMILIES,
    WEATHER_TOOL,
    build_trained_family,
)
from ..helpers import skip_for_missing

# a family's model trains in its fixture: about a minute under the CPU policy, several in the
# portable pass (which reuses the first pass's from the cache)
pytestmark = [pytest.mark.families, pytest.mark.timeout(900)]

CALL = ("get_weather", {"location": "Paris"})
USER = [{"role": "user", "content": QUESTION}]
GREEDY = {"temperature": 0}  # (this anthropic client takes no temperature argument)


@pytest.fixture(scope="module", params=list(TRAINED_FAMILIES))
def family(request, live_servers):
    """(its name, the trained family, a server of its model, the model's folder)."""
    trained = TRAINED_FAMILIES[request.param]
    if not (TEMPLATES / trained.template).exists():
        skip_for_missing(f"the shared chat templates ({TEMPLATES}) are not beside the repository")
    folder = build_trained_family(trained, request.param)
    return request.param, trained, live_servers.shared(folder), folder


def openai_chat(live, stream: bool, tools: bool, **extra):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    if tools:
        extra["tools"] = [WEATHER_TOOL]
    answer = client.chat.completions.create(
        model="m", messages=USER, max_tokens=80, temperature=0, stream=stream, **extra
    )
    if not stream:
        message = answer.choices[0].message
        calls = [
            (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
        ]
        reasoning = (message.model_extra or {}).get("reasoning_content") or ""
        return message.content or "", reasoning, calls, answer.choices[0].finish_reason
    content, reasoning, arguments, names, finish = "", "", {}, {}, None
    for chunk in answer:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            if call.function.name:
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
        finish = choice.finish_reason or finish
    calls = [(names[i], json.loads(arguments[i])) for i in sorted(names)]
    return content, reasoning, calls, finish


def responses(live, stream: bool, tools: bool):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    extra = {}
    if tools:
        function = WEATHER_TOOL["function"]
        extra["tools"] = [{"type": "function", **function}]
    if stream:
        with client.responses.stream(
            model="m", input=QUESTION, max_output_tokens=80, temperature=0, **extra
        ) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(
            model="m", input=QUESTION, max_output_tokens=80, temperature=0, **extra
        )
    content = reasoning = ""
    calls = []
    for item in response.output:
        if item.type == "reasoning":
            reasoning += "".join(part.text for part in item.content or [])
        elif item.type == "message":
            content += "".join(part.text for part in item.content if part.type == "output_text")
        elif item.type == "function_call":
            calls.append((item.name, json.loads(item.arguments)))
    return content, reasoning, calls, response.status


def anthropic_messages(live, stream: bool, tools: bool):
    client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0)
    extra = {}
    if tools:
        function = WEATHER_TOOL["function"]
        extra["tools"] = [
            {
                "name": function["name"],
                "description": function["description"],
                "input_schema": function["parameters"],
            }
        ]
    if stream:
        with client.messages.stream(
            model="m", messages=USER, max_tokens=80, extra_body=GREEDY, **extra
        ) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(
            model="m", messages=USER, max_tokens=80, extra_body=GREEDY, **extra
        )
    content = "".join(b.text for b in message.content if b.type == "text")
    reasoning = "".join(b.thinking for b in message.content if b.type == "thinking")
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    return content, reasoning, calls, message.stop_reason


def ollama_chat(live, stream: bool, tools: bool):
    client = ollama.Client(host=live.url)
    extra = {"tools": [WEATHER_TOOL]} if tools else {}
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 80}  # Ollama's: 1.1
    name = f"{live.engine.model_name}:latest"
    answer = client.chat(model=name, messages=USER, stream=stream, options=options, **extra)
    parts = list(answer) if stream else [answer]
    content = "".join(p.message.content or "" for p in parts)
    reasoning = "".join(p.message.thinking or "" for p in parts)
    calls = [
        (c.function.name, dict(c.function.arguments))
        for p in parts
        for c in p.message.tool_calls or []
    ]
    return content, reasoning, calls, parts[-1].done_reason


DOORS = {
    "openai chat": (openai_chat, "stop", "tool_calls"),
    "responses": (responses, "completed", "completed"),
    "anthropic": (anthropic_messages, "end_turn", "tool_use"),
    "ollama": (ollama_chat, "stop", "stop"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("door", DOORS)
def test_reasoning_and_content_come_back_apart(family, door, stream):
    _, trained, live, _ = family
    ask, ended, _ = DOORS[door]
    content, reasoning, calls, finish = ask(live, stream, tools=False)
    expected = REASONING if trained.reasons else ""
    assert (content, reasoning.strip(), calls, finish) == (CONTENT, expected, [], ended)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("door", DOORS)
def test_a_call_in_the_familys_syntax_comes_back_as_a_tool_call(family, door, stream):
    _, trained, live, _ = family
    ask, _, ended = DOORS[door]
    content, reasoning, calls, finish = ask(live, stream, tools=True)
    expected = CALL_REASONING if trained.reasons else ""
    assert (content.strip(), reasoning.strip(), calls, finish) == ("", expected, [CALL], ended)


# Forced calls held by grammar to the family's own syntax (mlxserve/chat/forced_calls.py): the
# raw text each family writes, which the grammar takes, and bare JSON, which it does not
RAW_CALLS = {
    "harmony": f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":'
    '"Paris"}<|call|>',
    "ministral3": '[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n"
    "</parameter>\n</function>\n</tool_call>",
}
BARE_JSON = '{"name": "get_weather", "arguments": {"location": "Paris"}}'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_required_call_comes_back_whatever_the_syntax(family, stream):
    """Held to the family's own syntax (harmony, Hermes' tags, Qwen3-Coder's XML, Mistral's).
    gpt-oss's grammar lets its analysis come first, and Qwen3-Coder reasons not: those answer
    as unforced. Qwen3's and Mistral's grammars leave out the reasoning they were trained to
    write first, which leaves these tiny models' arguments to chance."""
    name, trained, live, _ = family
    content, reasoning, calls, finish = openai_chat(live, stream, True, tool_choice="required")
    assert finish == "tool_calls" and content == ""
    assert calls and all(call[0] == "get_weather" for call in calls), calls
    if name in ("harmony", "qwen3_coder"):
        expected = CALL_REASONING if trained.reasons else ""
        assert (reasoning.strip(), calls) == (expected, [CALL])


def test_the_forced_grammar_takes_the_familys_own_call_not_bare_json(family):
    import llguidance
    import llguidance.hf
    from transformers import PreTrainedTokenizerFast

    from mlxserve.chat.forced_calls import harmony_grammar, mistral_grammar, xml_grammar

    name, _, _, folder = family
    if name not in RAW_CALLS:
        pytest.skip(f"{name}'s forced calls are JSON (in Hermes' tags, or bare)")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    special = dict(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids))
    if name == "harmony":
        grammar = harmony_grammar([WEATHER_TOOL], special)
    else:
        written = mistral_grammar if name == "ministral3" else xml_grammar
        grammar = written([WEATHER_TOOL], True, special)
    vocab = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))

    def takes(text: str) -> bool:
        matcher = llguidance.LLMatcher(vocab, llguidance.grammar_from("lark", grammar))
        ids = tokenizer.encode(text, add_special_tokens=False)
        return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()

    assert takes(RAW_CALLS[name])
    assert not takes(BARE_JSON)
