"""Tools for templates that do not render them: described in the system message and written
back in Hermes' syntax (Qwen2.5's own wording), which the Hermes parser then reads.

Tool results become user turns wrapped in <tool_response>, so a template that only knows
system/user/assistant (or insists that they alternate) still renders a tool round trip.
"""

from __future__ import annotations

import json
from typing import Any

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
RESPONSE_START, RESPONSE_END = "<tool_response>", "</tool_response>"

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def describe_tools(tools: list[dict[str, Any]]) -> str:
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_PREAMBLE + lines + TOOLS_INSTRUCTIONS


def with_tools_described(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tools' description appended to the first system message (or one of its own)."""
    description = describe_tools(tools)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        content = f"{first['content']}\n\n{description}" if first["content"] else description
        return [{**first, "content": content}, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


def call_text(call: dict[str, Any]) -> str:
    """One call as the model writes it: <tool_call>{"name", "arguments"}</tool_call>."""
    function = call["function"]
    body = {"name": function["name"], "arguments": function.get("arguments", {})}
    return f"{CALL_START}\n{json.dumps(body, ensure_ascii=False)}\n{CALL_END}"


def as_plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as Hermes text in the content; each run of tool results as one
    user message of <tool_response> blocks."""
    plain: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = "\n".join(call_text(c) for c in message["tool_calls"])
            content = f"{message['content']}\n{calls}" if message["content"] else calls
            rest = {k: v for k, v in message.items() if k != "tool_calls"}
            plain.append({**rest, "content": content})
        elif role == "tool":
            block = f"{RESPONSE_START}\n{message['content']}\n{RESPONSE_END}"
            previous = plain[-1] if plain else None
            if previous is not None and previous.get("_tool_results"):
                previous["content"] += "\n" + block
            else:
                plain.append({"role": "user", "content": block, "_tool_results": True})
        else:
            plain.append(message)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in plain]
