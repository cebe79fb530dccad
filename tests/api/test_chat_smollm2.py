"""Chat on a real instruct model (SmolLM2-135M-Instruct, its own ChatML template): the answer is
the model's greedy continuation of its rendered prompt, it ends at the end-of-turn token, and the
next turn reuses the conversation's KV from the prefix cache."""

from __future__ import annotations

import httpx
import openai
import pytest

from ..helpers import complete


@pytest.fixture
def smollm2(smollm2_server):
    with httpx.Client(base_url=smollm2_server.url, timeout=600) as http:
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
    first = ask(smollm2, messages, temperature=0, max_tokens=60)
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And why are sunsets red?"},
    ]
    second = ask(smollm2, messages, temperature=0, max_tokens=8)
    earlier = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"], (cached, earlier)
    assert cached <= second["usage"]["prompt_tokens"]
