"""An Anthropic Messages request as OpenAI chat's: content blocks become messages (a user turn's
tool_result blocks become `tool` messages first), tools and tool_choice their chat forms, so
the chat template, tool parsers, grammar and engine are the chat door's."""

from __future__ import annotations

import json
from typing import Any

from ...planning.request import Request
from ...settings import Limits
from ..errors import InvalidRequest
from ..hosted_tools import leave_out
from ..openai.chat_protocol import ChatCompletionRequest
from ..parsing import validate
from .protocol import (
    CountTokensRequest,
    MediaBlock,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def chat_request(body: CountTokensRequest, limits: Limits, strict_tools: bool = False) -> Request:
    """The chat request these messages, tools and settings make (count_tokens: no sampling)."""
    messages = chat_messages(body)
    fields: dict[str, Any] = {"messages": messages}
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and last.get("content") and not last.get("tool_calls"):
        # a prefill: Anthropic's answer continues the last assistant turn's text
        fields["continue_final_message"] = True
    tools = body.tools or []
    # Anthropic's own tools (a versioned `type`: web search, code execution, bash, ...): its
    # servers run them, or its models know their schema; left out here (hosted_tools)
    client = [t.type in (None, "custom") for t in tools]
    hosted = [(f"tools[{i}]", str(t.type)) for i, t in enumerate(tools) if not client[i]]
    leave_out(hosted, strict_tools, "/v1/messages")
    offered = [_tool(t) for t, own in zip(tools, client) if own]
    if offered:
        fields["tools"] = offered
    if body.tool_choice is not None and offered:
        choice = body.tool_choice
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequest("tool_choice of type 'tool' needs a name.", "tool_choice")
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            fields["tool_choice"] = CHOICES[choice.type]
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    template_kwargs = {}
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = body.thinking.type != "disabled"
    output = body.output_config
    if output is not None and output.effort:
        template_kwargs["reasoning_effort"] = output.effort
    if template_kwargs:
        fields["chat_template_kwargs"] = template_kwargs
    if output is not None and output.format is not None:
        schema = {"name": "output", "schema": output.format.schema_}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    if isinstance(body, MessagesRequest):
        fields["max_tokens"] = body.max_tokens
        fields["stop"] = body.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                fields[name] = getattr(body, name)
    return validate(ChatCompletionRequest, fields, limits).to_request()


def _tool(tool) -> dict[str, Any]:
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def system_text(body: CountTokensRequest) -> str:
    if isinstance(body.system, list):
        return "\n\n".join(block.text for block in body.system)
    return body.system or ""


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system_text(body):
        out.append({"role": "system", "content": system_text(body)})
    for i, message in enumerate(body.messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        texts, calls, reasoning, results = [], [], [], []
        for j, block in enumerate(message.content):
            if isinstance(block, MediaBlock):
                raise InvalidRequest(
                    f"Content block type '{block.type}' is not supported: this server runs text "
                    "models only. Send text blocks.",
                    param=f"{where}[{j}].type",
                    code="unsupported_content_type",
                )
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ThinkingBlock):
                reasoning.append(block.thinking)
            elif isinstance(block, ToolUseBlock):
                calls.append(_call(block))
            elif isinstance(block, ToolResultBlock):
                results.append(_result(block, f"{where}[{j}]"))
        out.extend(results)  # answers to the calls of the turn before, then what the user says
        if texts or calls or not results:
            turn: dict[str, Any] = {"role": message.role, "content": "".join(texts)}
            if calls:
                turn["tool_calls"] = calls
            if reasoning:
                turn["reasoning_content"] = "".join(reasoning)
            out.append(turn)
    return out


def _call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = json.dumps(block.input, ensure_ascii=False)
    return {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments},
    }


# A tool's result may hold what a text model cannot read (Claude Code's Read tool on a PNG or a
# PDF) or a reference to a deferred tool (its ToolSearch tool): each stands as a line saying so.
# A 400 there would come back with every later turn, which resends the result.
LEFT_OUT = {
    "image": "[image left out: this server runs text models only]",
    "document": "[document left out: this server runs text models only]",
    "search_result": "[search result left out]",
}


def _result(block: ToolResultBlock, where: str) -> dict[str, Any]:
    content = block.content
    if isinstance(content, list):
        parts, left_out = [], False
        for k, part in enumerate(content):
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind in LEFT_OUT:
                parts.append(LEFT_OUT[kind])
                left_out = True
            elif kind == "tool_reference" and isinstance(part.get("tool_name"), str):
                # every tool is offered whole here (defer_loading is not needed)
                parts.append(f"[tool {part['tool_name']} loaded]")
                left_out = True
            else:
                raise InvalidRequest(
                    f"{where}.content[{k}] must be a text block: this server runs text models "
                    "only.",
                    param=f"{where}.content[{k}]",
                )
        # text blocks run together as they always did; a line left out stands on its own
        content = ("\n" if left_out else "").join(parts)
    if block.is_error:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
