"""Chat on a real instruct model (SmolLM2-135M-Instruct, its own ChatML template): the answer is
the model's greedy continuation of its rendered prompt, it ends at the end-of-turn token, and the
next turn reuses the conversation's KV from the prefix cache."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ..conftest import SLOW_TEST_TIMEOUT_S
from ..helpers import complete

# A real model's chat over hundreds of tokens: once, in the CPU pass. What it checks (template,
# end of turn, prefix reuse, tool calls) is the same code on every platform; the portable pass
# keeps SmolLM2's 4-bit kernels in tests/engine/test_engine_models.py.
pytestmark = pytest.mark.slow


@pytest.fixture
def smollm2(smollm2_server):
    with httpx.Client(base_url=smollm2_server.url, timeout=SLOW_TEST_TIMEOUT_S) as http:
        yield http


def ask(http, messages: list[dict], **body) -> dict:
    response = http.post("/v1/chat/completions", json={"messages": messages, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_chat_is_the_completion_of_the_rendered_prompt(smollm2):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    result = ask(smollm2, messages, temperature=0, max_tokens=40, return_token_ids=True)
    (choice,) = result["choices"]
    prompt = "".join(
        f"<|im_start|>{role}\n{text}<|im_end|>\n"
        for role, text in [
            ("system", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
            ("user", "What is the capital of France?"),
        ]
    )
    prompt += "<|im_start|>assistant\n"
    plain = complete(smollm2, prompt=prompt, temperature=0, max_tokens=40, return_token_ids=True)
    assert choice["prompt_token_ids"] == plain["choices"][0]["prompt_token_ids"]
    assert choice["message"]["content"] == plain["choices"][0]["text"]
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"  # at <|im_end|>, the model's end of turn
    assert "<|im_end|>" not in choice["message"]["content"]


def test_the_openai_client_streams_the_same_answer(smollm2_server, smollm2):
    messages = [{"role": "user", "content": "Name three colors."}]
    whole = ask(smollm2, messages, temperature=0, max_tokens=30)["choices"][0]["message"]
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=smollm2_server.engine.model_name,
        messages=messages,
        temperature=0,
        max_tokens=30,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole["content"]


def test_the_next_turn_reuses_the_conversation_so_far(smollm2):
    messages = [
        {"role": "system", "content": "You answer in one short sentence. Turn check 42."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    first = ask(smollm2, messages, temperature=0, max_tokens=20)
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And why are sunsets red?"},
    ]
    second = ask(smollm2, messages, temperature=0, max_tokens=8)
    earlier = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"], (cached, earlier)
    assert cached <= second["usage"]["prompt_tokens"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_forced_call_on_a_real_model_and_its_round_trip(smollm2_server, smollm2):
    """SmolLM2's template renders no tools: they are described in its system message, and the
    forced call is written in Hermes' tags; the tool's result then goes back through the
    template, and the model answers from it."""
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(
        model=smollm2_server.engine.model_name,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(arguments) == {"city"}
    assert "paris" in arguments["city"].lower()  # the model read the question

    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 31}'},
    ]
    rendered = smollm2.post("/apply-template", json={"messages": messages, "tools": [WEATHER]})
    prompt = rendered.json()["prompt"]
    assert "<tool_call>" in prompt and '"temperature_c": 31' in prompt
    answer = client.chat.completions.create(
        model=smollm2_server.engine.model_name,
        messages=messages,
        tools=[WEATHER],
        temperature=0,
        max_tokens=40,
    )
    assert answer.choices[0].finish_reason in ("stop", "tool_calls")
    assert answer.usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prompt


def test_a_forced_call_streams_as_the_same_call(smollm2_server):
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    body = dict(
        model=smollm2_server.engine.model_name,
        messages=[{"role": "user", "content": "Weather in Oslo, please."}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
    )
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls[0]
    pieces = {"name": "", "arguments": ""}
    finish = None
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                pieces["name"] += delta.function.name or ""
                pieces["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert pieces == {"name": whole.function.name, "arguments": whole.function.arguments}
