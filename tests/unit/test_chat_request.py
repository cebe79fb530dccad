"""The chat request model: the fields and rules it shares with completions, chat's own fields
and the messages' rules, each refusal naming the field; and the canonical request it becomes."""

from __future__ import annotations

import pytest

from mlxserve.api.errors import InvalidRequest
from mlxserve.api.openai.chat_protocol import ChatCompletionRequest
from mlxserve.api.parsing import validate
from mlxserve.planning.request import Request
from mlxserve.settings import Limits

USER = [{"role": "user", "content": "Hi"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def chat(**fields) -> ChatCompletionRequest:
    return validate(ChatCompletionRequest, {"messages": USER, **fields})


def refusal(body: dict, limits: Limits | None = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        validate(ChatCompletionRequest, body, limits).to_request()
    return caught.value


def test_defaults_are_chat_defaults():
    request = chat().to_request()
    assert request.max_tokens is None  # until the model ends its turn
    assert request.chat.generation_prompt and not request.chat.continue_final_message
    assert request.output.logprobs is None


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_completion_tokens=5, max_tokens=7).max_tokens == 5
    assert chat(max_tokens=7).max_tokens == 7


def test_completions_fields_and_aliases_are_shared():
    body = chat(repeat_penalty=1.1, mirostat=2, samplers="kt", n_probs=3, seed=4)
    assert body.repetition_penalty == 1.1 and body.mirostat == 2
    assert body.samplers == ("top_k", "temperature") and body.seed == 4


def test_the_canonical_request_carries_the_engine_logprobs():
    request = chat(logprobs=True, top_logprobs=3, temperature=0, stop="x", n=2).to_request()
    assert isinstance(request, Request)
    assert request.output.logprobs == 3 and request.sampling.temperature == 0
    assert request.stop.strings == ("x",) and request.n == 2
    assert not request.output.echo and request.suffix is None and request.constraint is None
    assert chat(logprobs=True).to_request().output.logprobs == 0


def test_messages_become_what_templates_read():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    body = validate(ChatCompletionRequest, {"messages": messages})
    rendered = body.to_request().chat.template_messages()
    assert rendered[0] == {"role": "user", "content": "ab"}
    assert rendered[1]["content"] == ""
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert rendered[2] == {"role": "tool", "content": "2", "tool_call_id": "c1"}


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"messages": []}, "messages", "at least one message"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "Unknown role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "is required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].image_url.url",
            "must be a string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages[0].content[0].type",
            "'input_audio' is not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages[0].content[0].type",
            "Unknown content part type",
        ),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "c1", "content": "2"}]},
            "messages[1].role",
            "no assistant message with tool_calls",
        ),
        (
            {
                "messages": [
                    *USER,
                    {"role": "assistant", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c9", "content": "2"},
                ]
            },
            "messages[2].tool_call_id",
            "answers none of the calls",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "is not JSON",
        ),
        ({"messages": USER, "prompt": "x"}, "prompt", "not a chat field"),
        ({"messages": USER, "echo": True}, "echo", "not a chat field"),
        ({"messages": USER, "suffix": "x"}, "suffix", "not a chat field"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
        (
            {"messages": USER, "chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs",
            "may not set add_generation_prompt",
        ),
        (
            {"messages": USER, "continue_final_message": True},
            "continue_final_message",
            "assistant message last",
        ),
        (
            {
                "messages": [*USER, {"role": "assistant", "content": "x"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "add_generation_prompt",
            "Send one of them",
        ),
        ({"messages": USER, "n": 2, "best_of": 1}, "best_of", "at least n"),
        ({"messages": USER, "temperature": -1}, "temperature", "greater than or equal"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(body, param, says):
    error = refusal(body)
    assert error.param == param
    assert says in error.message


def test_top_logprobs_is_bounded_by_the_server():
    limits = Limits(max_top_logprobs=4)
    error = refusal({"messages": USER, "logprobs": True, "top_logprobs": 5}, limits)
    assert error.param == "top_logprobs" and "4 (this server's limit)" in error.message


def test_top_logprobs_goes_to_20_on_chat_as_openai_allows():
    """5 is OpenAI's legacy completions limit (--max-logprobs); chat's is 20."""
    assert chat(logprobs=True, top_logprobs=20).top_logprobs == 20
    error = refusal({"messages": USER, "logprobs": True, "top_logprobs": 21}, Limits())
    assert error.param == "top_logprobs"


def test_continuing_the_last_message_opens_no_new_turn():
    body = chat(
        messages=[*USER, {"role": "assistant", "content": "Sure"}], continue_final_message=True
    )
    assert not body.to_request().chat.generation_prompt


def test_the_schema_has_chat_fields_and_no_prompt():
    properties = ChatCompletionRequest.model_json_schema()["properties"]
    assert {"messages", "max_completion_tokens", "top_logprobs", "tools"} <= properties.keys()
    assert not {"prompt", "suffix", "echo"} & properties.keys()


def test_an_assistants_refusal_part_reads_as_its_text():
    """OpenAI's assistant content parts include `refusal`; a client replaying history sends it."""
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    body = chat(messages=[*USER, {"role": "assistant", "content": [refusal]}, *USER])
    assert body.to_request().chat.template_messages()[1]["content"] == "I can't help with that."
