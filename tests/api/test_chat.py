"""POST /v1/chat/completions on the tiny model (no template of its own: ChatML applies), through
the official openai client and raw HTTP: the answer, its stream, its logprobs, structured output,
tool calls and the reasoning split, and every bad input a 400 naming the field.

The random-weight model knows nothing of JSON, tools or thinking tags: whatever it writes in that
shape is the grammar's doing, and the split of that text is what is tested.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from ..helpers import complete, error_of, stream_chunks

USER = [{"role": "user", "content": "Say something."}]
SEEDS = 20
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def chat(http, path: str = "/v1/chat/completions", **body) -> dict:
    response = http.post(path, json={"messages": USER, **body})
    assert response.status_code == 200, response.text
    return response.json()


def chat_chunks(http, **body) -> list:
    """Every SSE payload of a streamed chat, parsed; '[DONE]' kept as a string."""
    return stream_chunks(http, "/v1/chat/completions", **{"messages": USER, **body})


def streamed(chunks: list) -> dict[int, dict]:
    """Per choice: content, reasoning and tool calls added up from the deltas, and the
    finish_reasons seen."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        for choice in chunk["choices"]:
            seen = out.setdefault(
                choice["index"],
                {"content": "", "reasoning": "", "calls": {}, "finish": [], "roles": []},
            )
            delta = choice["delta"]
            if "role" in delta:
                seen["roles"].append(delta["role"])
            seen["content"] += delta.get("content") or ""
            seen["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                entry = seen["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                entry["name"] += call.get("function", {}).get("name") or ""
                entry["arguments"] += call.get("function", {}).get("arguments") or ""
            if choice["finish_reason"]:
                seen["finish"].append(choice["finish_reason"])
    return out


def test_the_openai_client_gets_an_answer(client):
    result = client.chat.completions.create(
        model="tiny", messages=USER, max_completion_tokens=8, temperature=0
    )
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    (choice,) = result.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert result.usage.completion_tokens <= 8
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    assert result.usage.prompt_tokens_details.cached_tokens >= 0


def test_greedy_chat_is_completions_on_the_rendered_prompt(http, tokenizer):
    result = chat(http, max_tokens=24, temperature=0, return_token_ids=True)
    (choice,) = result["choices"]
    ids = choice["prompt_token_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
    plain = complete(http, prompt=ids, max_tokens=24, temperature=0, stop=["<|im_end|>"])
    assert choice["message"]["content"] == plain["choices"][0]["text"]
    assert choice["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert result["usage"]["prompt_tokens"] == len(ids)


def test_the_stream_is_the_answer_in_openais_chunks(client, http):
    body = {"max_tokens": 16, "temperature": 0}
    whole = chat(http, **body)["choices"][0]
    stream = client.chat.completions.create(
        model="tiny", messages=USER, stream=True, stream_options={"include_usage": True}, **body
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole["message"]["content"]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole["finish_reason"]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chat_chunks(http, **body)[-1] == "[DONE]"


def test_llama_cpps_path_is_the_same_route(http):
    body = {"max_tokens": 6, "temperature": 0}
    assert chat(http, "/chat/completions", **body)["choices"] == chat(http, **body)["choices"]


def test_n_choices_differ_and_a_seed_repeats_them(client):
    def run():
        result = client.chat.completions.create(
            model="tiny", messages=USER, n=3, seed=5, max_tokens=12, temperature=1.0
        )
        return [c.message.content for c in sorted(result.choices, key=lambda c: c.index)]

    first = run()
    assert len(first) == 3 and len(set(first)) > 1
    assert run() == first


def test_streamed_choices_each_get_a_role_and_one_finish(http):
    seen = streamed(chat_chunks(http, n=3, seed=2, max_tokens=6))
    assert sorted(seen) == [0, 1, 2]
    for choice in seen.values():
        assert choice["roles"] == ["assistant"] and len(choice["finish"]) == 1


def test_logprobs_come_in_chats_shape(client):
    result = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    (choice,) = result.choices
    content = choice.logprobs.content
    assert len(content) == result.usage.completion_tokens == 6
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-4
    assert "".join(e.token for e in content) == choice.message.content


def test_top_logprobs_reach_chats_limit_of_20(client):
    """OpenAI allows 0-20 on chat (5 is the legacy completions' limit); llama.cpp's chat tests
    ask for more than 5."""
    result = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=2, logprobs=True, top_logprobs=20
    )
    # alternatives that decode to the same text (the tiny model's byte tokens) are one entry
    assert all(5 < len(entry.top_logprobs) <= 20 for entry in result.choices[0].logprobs.content)


def test_logprobs_without_top_logprobs_have_no_alternatives(http):
    (choice,) = chat(http, max_tokens=3, logprobs=True, ignore_eos=True)["choices"]
    assert [e["top_logprobs"] for e in choice["logprobs"]["content"]] == [[], [], []]


def test_streamed_logprobs_cover_every_token(http):
    chunks = chat_chunks(
        http, max_tokens=5, temperature=0, logprobs=True, top_logprobs=1, ignore_eos=True
    )
    entries = [
        e
        for c in chunks
        if isinstance(c, dict)
        for choice in c["choices"]
        if choice["logprobs"]
        for e in choice["logprobs"]["content"]
    ]
    assert len(entries) == 5 and all(len(e["top_logprobs"]) == 1 for e in entries)


def test_json_schema_output_validates_on_twenty_seeds(client):
    result = client.chat.completions.create(
        model="tiny",
        messages=USER,
        n=SEEDS,
        seed=7,
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    finished = [c.message.content for c in result.choices if c.finish_reason == "stop"]
    assert len(finished) >= 18
    for text in finished:
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_is_constrained_in_a_stream_too(http):
    seen = streamed(
        chat_chunks(http, seed=3, max_tokens=400, response_format={"type": "json_object"})
    )
    if seen[0]["finish"] == ["stop"]:
        assert isinstance(json.loads(seen[0]["content"]), dict)


def valid_call(name: str, arguments: str) -> bool:
    jsonschema.validate(json.loads(arguments), TOOL_SCHEMAS[name])
    return True


def test_a_named_tool_choice_forces_that_call(client):
    result = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        seed=1,
        n=4,
        max_tokens=100,
    )
    for choice in result.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        assert valid_call(call.function.name, call.function.arguments)


def test_required_tool_choice_calls_one_of_the_tools_streamed(http):
    seen = streamed(
        chat_chunks(
            http,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            parallel_tool_calls=False,
            seed=2,
            n=4,
            max_tokens=100,
        )
    )
    for choice in seen.values():
        assert choice["finish"] == ["tool_calls"] and choice["content"] == ""
        (call,) = choice["calls"].values()
        assert valid_call(call["name"], call["arguments"])


def test_a_forced_call_is_written_in_the_models_syntax(http):
    """The tiny model has no parser of its own, so Hermes' syntax it is: the grammar makes the
    answer <tool_call> blocks, not bare JSON, as a model trained on that syntax writes calls."""
    result = chat(
        http, tools=[WEATHER, CLOCK], tool_choice="required", seed=3, max_tokens=400, logprobs=True
    )
    (choice,) = result["choices"]
    raw = "".join(entry["token"] for entry in choice["logprobs"]["content"])
    assert raw.startswith("<tool_call>\n{") and raw.endswith("}\n</tool_call>"), raw
    assert len(choice["message"]["tool_calls"]) == raw.count("<tool_call>")
    assert choice["message"]["content"] is None


def test_required_with_parallel_calls_may_call_several(http):
    result = chat(http, tools=[WEATHER, CLOCK], tool_choice="required", seed=4, max_tokens=200)
    (choice,) = result["choices"]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert calls and all(
        valid_call(c["function"]["name"], c["function"]["arguments"]) for c in calls
    )


def test_a_tool_round_trip_renders_the_call_and_its_result(http, tokenizer):
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    result = chat(http, messages=messages, tools=[WEATHER], max_tokens=4, return_token_ids=True)
    prompt = tokenizer.decode(result["choices"][0]["prompt_token_ids"], skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and "# Tools" in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}' in prompt
    )
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in prompt


def test_tool_choice_none_reads_no_calls(http):
    result = chat(
        http,
        tools=[WEATHER],
        tool_choice="none",
        guided_regex=r'<tool_call>\{"name": "get_weather", "arguments": \{\}\}</tool_call>',
        max_tokens=60,
    )
    (choice,) = result["choices"]
    assert choice["message"]["content"].startswith("<tool_call>")
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"


def test_a_call_in_the_models_syntax_is_parsed_with_tool_choice_auto(http):
    syntax = (
        r'Let me see\. <tool_call>\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}'
        r"</tool_call>"
    )
    result = chat(http, tools=[WEATHER, CLOCK], guided_regex=syntax, max_tokens=80)
    (choice,) = result["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me see. "
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    seen = streamed(chat_chunks(http, tools=[WEATHER, CLOCK], guided_regex=syntax, max_tokens=80))
    assert seen[0]["content"] == "Let me see. "
    assert list(seen[0]["calls"].values()) == [{"name": "get_time", "arguments": '{"zone": "UTC"}'}]


THINKING = r"<think>[a-z]{2,8}( [a-z]{2,8}){0,3}</think>[A-Z][a-z]{2,8}"


def test_thinking_goes_to_reasoning_content(http):
    result = chat(http, guided_regex=THINKING, seed=1, n=3, max_tokens=80)
    for choice in result["choices"]:
        message = choice["message"]
        assert re.fullmatch(r"[a-z]{2,8}( [a-z]{2,8}){0,3}", message["reasoning_content"])
        assert message["reasoning"] == message["reasoning_content"]
        assert re.fullmatch(r"[A-Z][a-z]{2,8}", message["content"])


def test_thinking_streams_as_reasoning_deltas(http):
    body = {"guided_regex": THINKING, "seed": 1, "max_tokens": 80}
    whole = chat(http, **body)["choices"][0]["message"]
    seen = streamed(chat_chunks(http, **body))
    assert seen[0]["reasoning"] == whole["reasoning_content"]
    assert seen[0]["content"] == whole["content"]


def test_reasoning_format_none_keeps_thinking_inline(http):
    result = chat(http, guided_regex=THINKING, seed=1, max_tokens=80, reasoning_format="none")
    message = result["choices"][0]["message"]
    assert message["content"].startswith("<think>") and "reasoning_content" not in message


def test_max_completion_tokens_bounds_the_answer(http):
    result = chat(http, max_completion_tokens=3, ignore_eos=True)
    assert result["usage"]["completion_tokens"] == 3
    assert result["choices"][0]["finish_reason"] == "length"


def test_continue_final_message_continues_it(http, tokenizer):
    messages = [*USER, {"role": "assistant", "content": "Well, I"}]
    result = chat(
        http, messages=messages, continue_final_message=True, max_tokens=2, return_token_ids=True
    )
    prompt = tokenizer.decode(result["choices"][0]["prompt_token_ids"], skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\nWell, I")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                        ],
                    }
                ]
            },
            "messages[0].content[1].image_url.url",  # a text model: it does not take images
        ),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
            "messages[1].role",
        ),
        ({"messages": "hello"}, "messages"),
        ({}, "messages"),
        ({"messages": USER, "prompt": "x"}, "prompt"),
        (
            {
                "messages": USER,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
        ),
        ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
        (
            {
                "messages": USER,
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        (
            {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema",
        ),
        ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": USER, "max_completion_tokens": -5}, "max_completion_tokens"),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(http, body, param):
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_is_a_400(http):
    response = http.post(
        "/v1/chat/completions", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert error_of(response, 400)["code"] == "invalid_json"


def test_the_openapi_document_has_the_chat_route(http):
    paths = http.get("/openapi.json").json()["paths"]
    body = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert "messages" in json.dumps(body) and "/chat/completions" in paths


def test_apply_template_returns_the_rendered_prompt(http):
    response = http.post("/apply-template", json={"messages": USER})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "prompt": "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n"
    }


def test_models_say_the_chat_template_is_a_fallback(http, server):
    (card,) = [m for m in http.get("/v1/models").json()["data"] if m.get("loaded")]
    assert card["chat_template"] == "chatml (fallback)"
    assert card["tool_parser"] == "hermes" and card["thinking"] is False
