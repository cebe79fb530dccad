"""POST /v1/responses on the tiny model, through the official openai client and raw HTTP: the
same prompt and greedy answer as /v1/chat/completions, output items whole and streamed, forced
function calls and JSON output (the grammar's doing on a random-weight model), and the 400s of a
server that stores nothing."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest

from mlxserve.api.openai.responses_api import Output, stream_response
from mlxserve.chat.output import Delta, OutputSpec
from mlxserve.chat.tool_calls import ToolCall
from mlxserve.engine import GenerationEvent

from ..helpers import error_of
from .test_chat import CLOCK as CHAT_CLOCK
from .test_chat import PERSON
from .test_chat import WEATHER as CHAT_WEATHER

SAY = "Say something."
USER = [{"role": "user", "content": SAY}]


def flat(tool: dict) -> dict:
    """A chat function tool in the Responses API's flat shape."""
    return {"type": "function", **tool["function"]}


WEATHER, CLOCK = flat(CHAT_WEATHER), flat(CHAT_CLOCK)
WEATHER_PARAMETERS = WEATHER["parameters"]
PERSON_FORMAT = {"format": {"type": "json_schema", "name": "person", "schema": PERSON}}


def respond(http, **body) -> dict:
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chat(http, **body) -> dict:
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def output_text(response: dict) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def shape(response) -> dict:
    """A response less what differs between two answers to one request: ids, times, the
    prefix cache's hits, and the fields the SDK adds as null."""
    data = response if isinstance(response, dict) else response.model_dump(mode="json")
    data = without_nulls(data)
    items = []
    for item in data["output"]:
        kept = {k: v for k, v in item.items() if k not in ("id", "call_id", "parsed")}
        if "content" in kept:
            kept["content"] = [
                {k: v for k, v in part.items() if k != "parsed"} for part in kept["content"]
            ]
        items.append(kept)
    return {
        "status": data["status"],
        "incomplete_details": data.get("incomplete_details"),
        "output": items,
        "usage": {k: v for k, v in data["usage"].items() if k != "input_tokens_details"},
    }


def without_nulls(value):
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def sse_events(http, **body) -> list[dict]:
    """Every event of a streamed response, its `event:` line checked against its type."""
    events = []
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                assert event["type"] == name
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def collapsed(events: list) -> list[str]:
    """The event types, each run of deltas as one."""
    types = [e["type"] if isinstance(e, dict) else e.type for e in events]
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and types[i - 1] == t)]


TEXT_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
]
START = ["response.created", "response.in_progress"]


def test_a_string_input_is_one_user_message(client, http):
    result = client.responses.create(model="tiny", input=SAY, max_output_tokens=8, temperature=0)
    assert result.object == "response" and result.id.startswith("resp_")
    assert result.status in ("completed", "incomplete") and result.error is None
    (item,) = result.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    plain = chat(http, messages=USER, max_tokens=8, temperature=0)
    assert result.output_text == plain["choices"][0]["message"]["content"]
    assert result.usage.input_tokens == plain["usage"]["prompt_tokens"]
    assert result.usage.output_tokens == plain["usage"]["completion_tokens"]
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens
    assert result.store is False and result.temperature == 0 and result.max_output_tokens == 8


def test_items_and_instructions_are_the_chat_messages(http):
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Fr"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Salut", "annotations": []}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "user", "content": "Again"},
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Fr"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Salut"},
        {"role": "user", "content": "Again"},
    ]
    result = respond(
        http, input=items, instructions="Be brief.", max_output_tokens=12, temperature=0
    )
    plain = chat(http, messages=messages, max_tokens=12, temperature=0)
    assert output_text(result) == plain["choices"][0]["message"]["content"]
    assert result["usage"]["input_tokens"] == plain["usage"]["prompt_tokens"]
    assert result["instructions"] == "Be brief."


def test_max_output_tokens_makes_it_incomplete(client, http):
    result = client.responses.create(model="tiny", input=SAY, max_output_tokens=2, temperature=0)
    assert result.status == "incomplete"
    assert result.incomplete_details.reason == "max_output_tokens"
    assert result.usage.output_tokens == 2 and result.output[0].status == "incomplete"
    events = sse_events(http, input=SAY, max_output_tokens=2, temperature=0)
    assert collapsed(events) == [*START, *TEXT_EVENTS, "response.incomplete"]
    assert shape(events[-1]["response"]) == shape(result)


def test_a_named_tool_choice_forces_that_call(client):
    result = client.responses.create(
        model="tiny",
        input="Weather?",
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        temperature=0,
    )
    assert result.status == "completed"
    (call,) = result.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    assert result.tool_choice.name == "get_weather" and len(result.tools) == 2


def test_a_streamed_call_comes_as_its_events(http):
    body = {
        "input": "Time?",
        "tools": [WEATHER, CLOCK],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 100,
        "temperature": 0,
    }
    events = sse_events(http, **body)
    assert collapsed(events) == [*START, *CALL_EVENTS, "response.completed"]
    (item,) = events[-1]["response"]["output"]
    assert events[-2]["item"] == item and item["arguments"] == events[-3]["arguments"]
    assert shape(events[-1]["response"]) == shape(respond(http, **body))


def test_a_function_call_round_trip_prompts_as_chat(http):
    arguments = '{"city": "Oslo", "days": 1}'
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": arguments,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
    ]
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    result = respond(http, input=items, tools=[WEATHER], max_output_tokens=6, temperature=0)
    plain = chat(http, messages=messages, tools=[CHAT_WEATHER], max_tokens=6, temperature=0)
    assert result["usage"]["input_tokens"] == plain["usage"]["prompt_tokens"]
    assert output_text(result) == (plain["choices"][0]["message"]["content"] or "")


def test_an_answers_output_items_go_back_as_input(client):
    """The SDK's way of holding a conversation without stored responses: the output items of
    one answer, then the call's result, are the next request's input."""
    tools = [WEATHER]
    first = client.responses.create(
        model="tiny",
        input="Weather?",
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=100,
        temperature=0,
    )
    (call,) = first.output
    items = [
        {"role": "user", "content": "Weather?"},
        *(item.model_dump() for item in first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
    ]
    second = client.responses.create(
        model="tiny", input=items, tools=tools, max_output_tokens=4, temperature=0, store=False
    )
    assert second.status in ("completed", "incomplete") and second.output[0].type == "message"


def test_a_json_schema_format_is_followed(client):
    result = client.responses.create(
        model="tiny", input="A person", text=PERSON_FORMAT, max_output_tokens=200, temperature=0
    )
    assert result.status == "completed" and result.text.format.type == "json_schema"
    jsonschema.validate(json.loads(result.output_text), PERSON)


def test_the_sdks_stream_is_the_whole_response(client):
    body = {
        "model": "tiny",
        "input": "A person",
        "text": PERSON_FORMAT,
        "max_output_tokens": 200,
        "temperature": 0,
    }
    whole = client.responses.create(**body)
    with client.responses.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert collapsed(events) == [*START, *TEXT_EVENTS, "response.completed"]
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    assert final.id == events[0].response.id and final.output_text == whole.output_text
    assert shape(final) == shape(whole)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text


def test_stream_true_gives_the_sdk_typed_events(client):
    stream = client.responses.create(model="tiny", input=SAY, max_output_tokens=4, stream=True)
    types = [event.type for event in stream]
    assert types[:2] == START and types[-1] == "response.incomplete"


def test_reasoning_goes_first_in_its_own_item():
    output = Output()
    events = output.add(Delta(reasoning="hm"))
    events += output.add(Delta(reasoning=" ok", content="Yes"))
    events += output.add(Delta(calls=[ToolCall("f", "{}", "call_1")]))
    events += output.finish("stop")
    reasoning, message, call = output.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hm ok"}]
    assert message["content"][0]["text"] == "Yes" and message["status"] == "completed"
    assert call["arguments"] == "{}" and call["call_id"] == "call_1"
    reasoning_events = [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert collapsed(events) == reasoning_events + TEXT_EVENTS + CALL_EVENTS
    assert [e["output_index"] for e in events if e["type"].endswith("item.done")] == [0, 1, 2]


def test_an_empty_answer_is_an_empty_message():
    output = Output()
    output.finish("stop")
    (message,) = output.items
    assert message["content"][0]["text"] == "" and message["type"] == "message"


def test_an_engine_error_after_the_200_is_response_failed():
    async def events():
        yield GenerationEvent(0, text="Hel")
        yield GenerationEvent(0, error="the engine stopped")

    async def read() -> list[str]:
        plan = SimpleNamespace(prompts=[SimpleNamespace(ids=(1, 2))], per_prompt=1)
        response = {"id": "resp_1", "status": "in_progress", "output": [], "error": None}
        return [chunk async for chunk in stream_response(events(), plan, OutputSpec(), response)]

    chunks = asyncio.run(read())
    sent = [json.loads(chunk.split("data: ", 1)[1]) for chunk in chunks]
    assert collapsed(sent) == [*START, *TEXT_EVENTS[:3], "response.failed"]
    failed = sent[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "the engine stopped"
    assert failed["output"][0]["content"][0]["text"] == "Hel"


def test_previous_response_id_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input=SAY, previous_response_id="resp_1")
    error = caught.value.body
    assert caught.value.code == "unsupported_parameter"
    assert error["param"] == "previous_response_id" and "store" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": SAY, "tools": [{"type": "namespace", "name": "n"}]}, "tools[0].tools"),
        ({"input": SAY, "conversation": "conv_1"}, "conversation"),
        ({"input": SAY, "background": True}, "background"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].image_url",  # a text model: it does not take images
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
            "input[0].arguments",
        ),
        (
            {"input": SAY, "tools": [WEATHER], "tool_choice": {"type": "function"}},
            "tool_choice.name",
        ),
        ({"input": SAY, "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"input": SAY, "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": SAY, "temperature": 3}, "temperature"),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(http, body, param):
    error = error_of(http.post("/v1/responses", json=body), 400)
    assert error["param"] == param, error


def test_the_openapi_document_has_the_route(http):
    paths = http.get("/openapi.json").json()["paths"]
    schema = paths["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]
    assert re.search(r'"input"', json.dumps(schema))


# Codex CLI 0.17x's default tools (wire_api "responses"): its agent tools in a namespace, and a
# web search it expects the provider to run.
CODEX_TOOLS = [
    {"type": "namespace", "name": "multi_agent_v1", "tools": [WEATHER, CLOCK]},
    {"type": "web_search", "external_web_access": False},
]


def test_a_namespaces_function_tools_are_offered_under_their_names(client):
    result = client.responses.create(
        model="tiny",
        input="Weather?",
        tools=CODEX_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        temperature=0,
    )
    (call,) = result.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)


def test_hosted_tools_are_left_out_of_the_prompt_unless_strict(http, live_server, tiny_model):
    from mlxserve.settings import ChatSettings

    plain = respond(http, input=SAY, tools=[WEATHER], max_output_tokens=4, temperature=0)
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "file_search"}]
    beside = respond(http, input=SAY, tools=[*hosted, WEATHER], max_output_tokens=4, temperature=0)
    assert beside["usage"]["input_tokens"] == plain["usage"]["input_tokens"]
    assert output_text(beside) == output_text(plain)
    strict = live_server(tiny_model, chat=ChatSettings(strict_tools=True))
    refused = httpx.post(
        strict.url + "/v1/responses", json={"input": SAY, "tools": CODEX_TOOLS}, timeout=60
    )
    error = error_of(refused, 400)
    assert error["param"] == "tools[1].type" and error["code"] == "unsupported_tool_type"
    assert "web_search" in error["message"]


def test_a_namespaces_call_goes_back_with_its_namespace(http):
    """Codex finds a call's tool by namespace and name."""
    body = {
        "input": "Weather?",
        "tools": CODEX_TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 100,
        "temperature": 0,
    }
    (call,) = respond(http, **body)["output"]
    assert call["namespace"] == "multi_agent_v1" and call["name"] == "get_weather"
    done = [e for e in sse_events(http, **body) if e["type"] == "response.output_item.done"]
    assert done[-1]["item"]["namespace"] == "multi_agent_v1"
    plain = respond(http, **{**body, "tools": [WEATHER]})["output"][0]
    assert "namespace" not in plain


# Codex's apply_patch since 0.131: a custom tool, its free-form input in a Lark grammar.
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


def test_a_custom_tool_is_called_with_its_raw_input_and_read_back(http):
    body = {
        "input": "Fix it.",
        "tools": [APPLY_PATCH, WEATHER],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "max_output_tokens": 60,
        "temperature": 0,
    }
    (call,) = respond(http, **body)["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert isinstance(call["input"], str) and call["call_id"].startswith("call_")
    events = sse_events(http, **body)
    kinds = [e["type"] for e in events]
    assert "response.custom_tool_call_input.done" in kinds
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == call["input"]
    # the call and its output go back as history, as the function call they were
    history = [
        {"role": "user", "content": "Fix it."},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
    ]
    as_functions = [
        {"role": "user", "content": "Fix it."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "apply_patch",
            "arguments": json.dumps({"input": "*** x"}),
        },
        {"type": "function_call_output", "call_id": "c1", "output": "Done!"},
    ]
    read_back = respond(http, input=history, tools=[APPLY_PATCH], max_output_tokens=4)
    functions = respond(http, input=as_functions, tools=[APPLY_PATCH], max_output_tokens=4)
    assert read_back["usage"]["input_tokens"] == functions["usage"]["input_tokens"]


def test_an_image_in_a_tool_result_stands_as_a_line_not_a_400(http):
    """Codex's view_image returns an image; the next turn would resend it for ever."""
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    history = [
        {"role": "user", "content": "Look."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [image]},
    ]
    assert respond(http, input=history, tools=[WEATHER], max_output_tokens=2)["status"]
    user_image = [{"role": "user", "content": [image]}]
    assert http.post("/v1/responses", json={"input": user_image}).status_code == 400


def test_a_resumed_codex_sessions_history_reads_on(http):
    """Text echoed between a call and its output joins the call's turn; what OpenAI ran itself
    (web_search_call, compaction) is left out; a GPT model's local_shell_call reads as a call."""
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}
    echoed = [
        {"role": "user", "content": "Weather?"},
        call,
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        output,
    ]
    in_order = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        call,
        output,
    ]
    kept = respond(http, input=echoed, tools=[WEATHER], max_output_tokens=4, temperature=0)
    ordered = respond(http, input=in_order, tools=[WEATHER], max_output_tokens=4, temperature=0)
    assert kept["usage"]["input_tokens"] == ordered["usage"]["input_tokens"]
    assert output_text(kept) == output_text(ordered)
    resumed = [
        {"role": "user", "content": "List files."},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
        {"type": "compaction", "encrypted_content": "opaque"},
        {
            "type": "local_shell_call",
            "call_id": "c2",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"]},
        },
        {"type": "local_shell_call_output", "call_id": "c2", "output": "README.md"},
    ]
    assert respond(http, input=resumed, max_output_tokens=2)["status"]
