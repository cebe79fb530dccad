"""Anthropic's /v1/messages and /v1/messages/count_tokens through the official `anthropic`
package on a real server: text, system, stop sequences, forced tools, a tool_result round trip,
streams reassembled by the SDK's own helpers, token counts, and errors in Anthropic's shape. The
answers equal OpenAI chat's on the same conversation (greedy)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from .test_chat import WEATHER

USER = [{"role": "user", "content": "Tell me a story."}]
TOOL = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}


@pytest.fixture
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


# Anthropic's current API has no sampling fields; older clients send them and the server still
# honours them, so tests get greedy answers through extra_body.
GREEDY = {"temperature": 0}


def greedy(claude, **body):
    return claude.messages.create(
        model="claude-sonnet-4-5", max_tokens=12, extra_body=GREEDY, **{"messages": USER, **body}
    )


def openai_greedy(client, messages, **body):
    return client.chat.completions.create(
        model="x", messages=messages, temperature=0, max_tokens=12, **body
    )


def test_text_answers_as_openai_chat_does(claude, client):
    message = greedy(claude)
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "claude-sonnet-4-5" and message.id.startswith("msg_")
    (block,) = message.content
    assert block.type == "text" and message.stop_reason == "max_tokens"
    openai = openai_greedy(client, USER)
    assert block.text == openai.choices[0].message.content
    usage = message.usage
    assert usage.output_tokens == 12
    assert usage.input_tokens + usage.cache_read_input_tokens == openai.usage.prompt_tokens


def test_a_system_prompt_as_text_or_blocks(claude, client):
    system = "You are terse."
    as_text = greedy(claude, system=system)
    as_blocks = greedy(claude, system=[{"type": "text", "text": system}])
    openai = openai_greedy(client, [{"role": "system", "content": system}, *USER])
    assert as_text.content[0].text == as_blocks.content[0].text
    assert as_text.content[0].text == openai.choices[0].message.content


def test_a_stop_sequence_ends_the_answer_and_is_named(claude):
    text = greedy(claude).content[0].text
    assert len(text) >= 4, text
    stop = text[2:4]
    stopped = greedy(claude, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]


def test_a_forced_tool_is_called_with_valid_input(claude):
    message = claude.messages.create(
        model="claude",
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, TOOL["input_schema"])


def test_a_tool_result_round_trip_renders_as_openai_chat_does(claude, client):
    arguments = {"city": "Oslo", "days": 1}
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": arguments},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    ours = greedy(claude, messages=messages, tools=[TOOL])
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
    }
    openai = openai_greedy(
        client,
        [
            messages[0],
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 C"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        tools=[WEATHER],
    )
    usage = ours.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == openai.usage.prompt_tokens
    assert ours.content[0].text == (openai.choices[0].message.content or "")


def test_streams_reassemble_to_the_whole_answer(claude):
    whole = greedy(claude)
    with claude.messages.stream(
        model="claude", max_tokens=12, extra_body=GREEDY, messages=USER
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    forced = {
        "model": "claude",
        "max_tokens": 200,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    with claude.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    made = claude.messages.create(**forced)
    assert streamed.stop_reason == made.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (b.name, b.input) for b in made.content if b.type == "tool_use"
    ]


def test_the_event_sequence_is_anthropics(http):
    body = {"model": "c", "max_tokens": 4, "temperature": 0, "messages": USER, "stream": True}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200
    events = [
        line.removeprefix("event: ")
        for line in response.text.splitlines()
        if line.startswith("event: ")
    ]
    assert events[:3] == ["message_start", "ping", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[3:-3]) == {"content_block_delta"}


def test_structured_output_follows_its_schema(claude):
    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    message = claude.messages.create(
        model="claude",
        max_tokens=200,
        messages=[{"role": "user", "content": "A person as JSON"}],
        output_config={"format": {"type": "json_schema", "schema": person}},
    )
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), person)


def test_count_tokens_is_what_usage_reports(claude):
    request = {
        "model": "claude",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [TOOL],
    }
    counted = claude.messages.count_tokens(**request).input_tokens
    usage = claude.messages.create(max_tokens=2, **request).usage
    assert counted == usage.input_tokens + usage.cache_read_input_tokens > 0


def test_errors_are_anthropics(claude, server):
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="c", max_tokens=0, messages=USER)
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in bad.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    for body in (
        {"messages": USER},  # no max_tokens
        {"max_tokens": 4, "messages": [{"role": "user", "content": [image]}]},
        {"max_tokens": 4, "messages": [{"role": "wizard", "content": "Hi"}]},
    ):
        response = httpx.post(server.url + "/v1/messages", json={"model": "c", **body}, timeout=60)
        assert response.status_code == 400, (body, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    missing = httpx.post(server.url + "/v1/messages/batches", json={}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_the_api_key_comes_as_x_api_key(live_server, tiny_model):
    live = live_server(tiny_model, api_key="sesame")
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0).messages.create(
            model="c", max_tokens=2, messages=USER
        )
    assert refused.value.body["error"]["type"] == "authentication_error"
    keyed = anthropic.Anthropic(base_url=live.url, api_key="sesame", max_retries=0)
    assert keyed.messages.create(model="c", max_tokens=2, messages=USER).usage.output_tokens == 2


def test_reasoning_becomes_thinking_blocks_whole_and_streamed():
    """The random model writes no thinking tags; the shaping of a reasoned answer is checked
    on the reply builder itself: a thinking block first, then text, then the calls."""
    from mlxserve.api.anthropic.replies import Blocks, Reply
    from mlxserve.api.responses import SequenceResult
    from mlxserve.chat.output import Delta, OutputSpec
    from mlxserve.chat.tool_calls import ToolCall
    from mlxserve.planning.plan import Plan
    from mlxserve.prompt import Prompt

    plan = Plan(body=None, prompts=[Prompt((1, 2, 3), "")], sequences=[], per_prompt=1)
    reply = Reply("msg_1", "claude", OutputSpec(), plan, [])
    call = ToolCall(name="get_weather", arguments='{"city": "Oslo"}', id="toolu_1")
    answer = Delta(content="Let me check.", reasoning="The user wants weather.", calls=[call])
    result = SequenceResult(finish_reason="stop", completion_tokens=9)
    message = reply.message(result, answer)
    assert [block["type"] for block in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][0]["thinking"] == "The user wants weather."
    assert message["content"][2]["input"] == {"city": "Oslo"}
    assert message["stop_reason"] == "tool_use"
    blocks = Blocks()
    events = blocks.feed(Delta(reasoning="Hmm")) + blocks.feed(answer) + blocks.finish()
    kinds = [json.loads(e.split("data: ", 1)[1]) for e in events]
    deltas = [k["delta"]["type"] for k in kinds if k["type"] == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "text_delta", "input_json_delta"]
    starts = [k["content_block"]["type"] for k in kinds if k["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert [k["type"] for k in kinds].count("content_block_stop") == 3


# Claude Code 2.1's first request with its Agent and Skill tools on (its default): the agent and
# skill lists come as system messages inside `messages`, under a beta header.
MID_CONVERSATION_SYSTEM = "mid-conversation-system-2026-04-07"


def test_system_messages_inside_messages_answer_as_openai_chat_does(server, client):
    messages = [
        {"role": "user", "content": "Say hi"},
        {"role": "system", "content": "Available agent types: none."},
    ]
    answer = httpx.post(
        server.url + "/v1/messages",
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": MID_CONVERSATION_SYSTEM},
        json={"model": "claude-sonnet-4-5", "max_tokens": 12, "messages": messages, **GREEDY},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    openai = openai_greedy(client, messages)
    assert answer.json()["content"][0]["text"] == openai.choices[0].message.content
    blocks = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, *USER]
    assert greedy(claude_for(server), messages=blocks).stop_reason == "max_tokens"


def claude_for(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_anthropics_own_tools_are_left_out_unless_strict(claude, live_server, tiny_model):
    from mlxserve.settings import ChatSettings

    hosted = [
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "bash_20250124", "name": "bash"},
    ]
    request = {"model": "c", "messages": USER, "tools": [TOOL]}
    alone = claude.messages.count_tokens(**request).input_tokens
    beside = claude.messages.count_tokens(**{**request, "tools": [*hosted, TOOL]}).input_tokens
    assert beside == alone
    assert claude.messages.create(max_tokens=2, **{**request, "tools": hosted}).usage.output_tokens
    strict = live_server(tiny_model, chat=ChatSettings(strict_tools=True))
    refused = httpx.post(
        strict.url + "/v1/messages",
        json={"max_tokens": 2, **request, "tools": [TOOL, *hosted]},
        timeout=60,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and "web_search_20250305" in error["message"]


def test_a_prompt_over_the_context_is_worded_as_anthropic_words_it(claude, server):
    """Claude Code compacts its conversation when it reads `prompt is too long`."""
    context = server.engine.loaded.context_length
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(
            model="c",
            max_tokens=4,
            messages=[{"role": "user", "content": "story time " * context}],
        )
    error = bad.value.body["error"]
    assert error["type"] == "invalid_request_error"
    tokens = int(error["message"].split(": ")[1].split(" ")[0])
    assert error["message"] == f"prompt is too long: {tokens} tokens > {context} maximum"
    assert tokens > context


def test_images_documents_and_tool_references_in_a_tool_result_stand_as_lines(claude, client):
    """Claude Code's Read tool on a PNG or PDF, and its ToolSearch's tool_reference blocks: a 400
    would come back with every later turn, which resends the result."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    result = [
        {"type": "text", "text": "Read 2 files:"},
        image,
        pdf,
        {"type": "tool_reference", "tool_name": "mcp__files__grep"},
    ]
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "x"}}
    messages = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
        },
    ]
    ours = claude.messages.count_tokens(model="c", messages=messages, tools=[TOOL]).input_tokens
    said = (
        "Read 2 files:\n[image left out: a tool's result is given to the model as text]\n"
        "[document left out: a tool's result is given to the model as text]\n"
        "[tool mcp__files__grep loaded]"
    )
    openai_call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "x"})},
    }
    openai = client.chat.completions.create(
        model="x",
        messages=[
            {"role": "user", "content": "Look."},
            {"role": "assistant", "content": "", "tool_calls": [openai_call]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": said},
        ],
        tools=[WEATHER],
        max_tokens=1,
    )
    assert ours == openai.usage.prompt_tokens


def test_a_forced_call_cut_by_max_tokens_ends_as_anthropics_does(claude, client):
    """stop_reason max_tokens with the tool_use block last (its JSON as far as it was written in
    the stream); no text block of half-written JSON after it. Chat: finish_reason length with
    the call, its arguments cut, and no content."""
    request = {
        "model": "claude",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    whole = claude.messages.create(max_tokens=200, **request)
    cut_at = whole.usage.output_tokens - 3
    cut = claude.messages.create(max_tokens=cut_at, **request)
    assert cut.stop_reason == "max_tokens"
    assert [b.type for b in cut.content] == ["tool_use"] and cut.content[0].name == "get_weather"
    with claude.messages.stream(max_tokens=cut_at, **request) as stream:
        events = list(stream)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["tool_use"]
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert partial and not partial.rstrip().endswith("}}")  # cut inside the arguments
    chat = client.chat.completions.create(
        model="x",
        messages=request["messages"],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=cut_at,
    )
    (choice,) = chat.choices
    assert choice.finish_reason == "length" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")


def test_a_trailing_assistant_message_is_continued_as_anthropic_continues_it(claude, client):
    messages = [*USER, {"role": "assistant", "content": "Once upon"}]
    ours = greedy(claude, messages=messages)
    openai = openai_greedy(client, messages, extra_body={"continue_final_message": True})
    assert ours.content[0].text == openai.choices[0].message.content
    opened = openai_greedy(client, messages)
    assert ours.content[0].text != opened.choices[0].message.content  # not a new turn
