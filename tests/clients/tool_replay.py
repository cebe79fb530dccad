"""A forced tool call and its result, in the exact request shape an agent sent: the tiny model's
own text never calls a tool, so the agent's first request is sent again with `tool_choice`
naming one of its tools (the grammar makes the call), then again with the call and a result.

Per API: how to name the tool, where the call comes back, how the result goes in.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema

REPLAY_MAX_TOKENS = 400  # the smallest of an agent's tools, called with its arguments
RESULT = "hello.py has 2 lines."


def simplest_tool(tools: list[dict], schema_of) -> dict:
    """The tool with the shortest schema that names its properties: its call is the quickest for
    the grammar to finish (an object of any keys lets a random model write keys without end).
    Not a deferred one (Claude Code's placeholder, never to be called)."""
    usable = [
        tool
        for tool in tools
        if (schema_of(tool) or {}).get("properties") and not tool.get("defer_loading")
    ]
    return min(usable, key=lambda tool: len(json.dumps(schema_of(tool))))


def anthropic(body: dict) -> tuple[dict, dict]:
    tool = simplest_tool(body["tools"], lambda t: t.get("input_schema"))
    forced = body | {"tool_choice": {"type": "tool", "name": tool["name"]}, "stream": False}
    forced.pop("thinking", None)  # Anthropic: no thinking when a tool is forced
    forced["max_tokens"] = REPLAY_MAX_TOKENS
    return forced, tool


def anthropic_call(reply: dict, tool: dict) -> dict[str, Any]:
    assert reply["stop_reason"] == "tool_use", reply
    (call,) = [block for block in reply["content"] if block["type"] == "tool_use"]
    assert call["name"] == tool["name"]
    jsonschema.validate(call["input"], tool["input_schema"])
    return call


def anthropic_result(forced: dict, reply: dict, call: dict) -> dict:
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": RESULT}
    messages = [
        *forced["messages"],
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": [result]},
    ]
    return {key: value for key, value in forced.items() if key != "tool_choice"} | {
        "messages": messages
    }


def chat(body: dict) -> tuple[dict, dict]:
    tool = simplest_tool(body["tools"], lambda t: t.get("function", {}).get("parameters"))
    name = tool["function"]["name"]
    forced = body | {"tool_choice": {"type": "function", "function": {"name": name}}}
    forced |= {"stream": False, "max_tokens": REPLAY_MAX_TOKENS}
    forced.pop("stream_options", None)
    forced.pop("max_completion_tokens", None)
    return forced, tool


def chat_call(reply: dict, tool: dict) -> dict[str, Any]:
    message = reply["choices"][0]["message"]
    assert len(message.get("tool_calls") or []) == 1, (tool["function"]["name"], reply)
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == tool["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    return call


def chat_result(forced: dict, reply: dict, call: dict) -> dict:
    message = reply["choices"][0]["message"]
    messages = [
        *forced["messages"],
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": RESULT},
    ]
    return {key: value for key, value in forced.items() if key != "tool_choice"} | {
        "messages": messages
    }


def responses(body: dict) -> tuple[dict, dict]:
    functions = [tool for tool in body["tools"] if tool.get("type") == "function"]
    tool = simplest_tool(functions, lambda t: t.get("parameters"))
    forced = body | {"tool_choice": {"type": "function", "name": tool["name"]}, "stream": False}
    forced["max_output_tokens"] = REPLAY_MAX_TOKENS
    return forced, tool


def responses_call(reply: dict, tool: dict) -> dict[str, Any]:
    calls = [item for item in reply["output"] if item["type"] == "function_call"]
    assert len(calls) == 1, (tool["name"], reply)
    (call,) = calls
    assert call["name"] == tool["name"]
    jsonschema.validate(json.loads(call["arguments"]), tool["parameters"])
    return call


def responses_result(forced: dict, reply: dict, call: dict) -> dict:
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}
    items = [*forced["input"], *reply["output"], result]
    return {key: value for key, value in forced.items() if key != "tool_choice"} | {"input": items}


SHAPES = {
    "/v1/messages": (anthropic, anthropic_call, anthropic_result),
    "/v1/chat/completions": (chat, chat_call, chat_result),
    "/v1/responses": (responses, responses_call, responses_result),
}


def round_trip(url: str, path: str, body: dict) -> str:
    """The forced call, then its result: both answered 200. Returns the tool's name."""
    force, read_call, with_result = SHAPES[path]
    forced, tool = force(body)
    with httpx.Client(base_url=url, timeout=300) as http:
        response = http.post(path, json=forced)
        assert response.status_code == 200, response.text
        reply = response.json()
        call = read_call(reply, tool)
        response = http.post(path, json=with_result(forced, reply, call))
        assert response.status_code == 200, response.text
    return call.get("name") or call.get("function", {}).get("name")
