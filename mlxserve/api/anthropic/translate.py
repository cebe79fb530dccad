"""An Anthropic Messages request as the canonical one: content blocks become messages (a user
turn's tool_result blocks become `tool` messages first), tools and tool_choice the shared forms,
so the chat template, tool parsers, grammar and engine are the other chat doors'."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...engine import StopSpec
from ...planning.defaults import SAMPLING, top_k
from ...planning.messages import Call, Message, check_messages, image_part
from ...planning.request import Chat, NamedTool, Request
from ..constraints import schema_constraint
from ..errors import InvalidRequest
from ..hosted_tools import leave_out
from ..protocol import stop_strings
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


def chat_request(body: CountTokensRequest, strict_tools: bool = False) -> Request:
    """The request these messages, tools and settings make (count_tokens: no sampling)."""
    messages = chat_messages(body)
    last = messages[-1] if messages else None
    # a prefill: Anthropic's answer continues the last assistant turn's text
    prefill = last is not None and last.role == "assistant" and bool(last.content)
    tools = body.tools or []
    # Anthropic's own tools (a versioned `type`: web search, code execution, bash, ...): its
    # servers run them, or its models know their schema; left out here (hosted_tools)
    client = [t.type in (None, "custom") for t in tools]
    hosted = [(f"tools[{i}]", str(t.type)) for i, t in enumerate(tools) if not client[i]]
    leave_out(hosted, strict_tools, "/v1/messages")
    offered = tuple(_tool(t) for t, own in zip(tools, client) if own)
    tool_choice, parallel = None, True
    if body.tool_choice is not None and offered:
        choice = body.tool_choice
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequest("tool_choice of type 'tool' needs a name.", "tool_choice")
            tool_choice = NamedTool(choice.name)
        else:
            tool_choice = CHOICES[choice.type]
        parallel = not choice.disable_parallel_tool_use
    template_kwargs = {}
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = body.thinking.type != "disabled"
    output = body.output_config
    if output is not None and output.effort:
        template_kwargs["reasoning_effort"] = output.effort
    chat = Chat(
        check_messages(messages),
        offered,
        tool_choice,
        parallel,
        continue_final_message=prefill and not last.tool_calls,
        template_kwargs=template_kwargs or None,
    )
    constraint = None
    if output is not None and output.format is not None:
        constraint = schema_constraint("response_format", output.format.schema_)
    request = Request(SAMPLING, StopSpec(), model=body.model, constraint=constraint, chat=chat)
    if not isinstance(body, MessagesRequest):
        return request
    sampling = {
        name: getattr(body, name)
        for name in ("temperature", "top_p", "top_k")
        if getattr(body, name) is not None
    }
    if "top_k" in sampling:
        sampling["top_k"] = top_k(sampling["top_k"])
    return replace(
        request,
        sampling=replace(SAMPLING, **sampling),
        stop=StopSpec(strings=tuple(stop_strings(body.stop_sequences))),
        max_tokens=body.max_tokens,
    )


def _tool(tool) -> dict[str, Any]:
    """A client tool as templates read it (name, description, parameters: chat's order)."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return {"type": "function", "function": function}


def system_text(body: CountTokensRequest) -> str:
    if isinstance(body.system, list):
        return "\n\n".join(block.text for block in body.system)
    return body.system or ""


def chat_messages(body: CountTokensRequest) -> list[Message]:
    out: list[Message] = []
    if system_text(body):
        out.append(Message("system", system_text(body)))
    for i, message in enumerate(body.messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append(Message(message.role, message.content))
            continue
        texts, calls, reasoning, results = [], [], [], []
        for j, block in enumerate(message.content):
            if isinstance(block, MediaBlock) and block.type == "image" and message.role == "user":
                texts.append(_image(block, f"{where}[{j}]"))  # an image part among the texts
                continue
            if isinstance(block, MediaBlock):
                raise InvalidRequest(
                    f"Content block type '{block.type}' is not supported: send text blocks "
                    "(and images in a user's message).",
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
            content = _joined(texts)
            out.append(
                Message(
                    message.role,
                    content,
                    tool_calls=tuple(calls),
                    reasoning_content="".join(reasoning) if reasoning else None,
                )
            )
    return out


def _joined(pieces: list[str | dict[str, Any]], separator: str = "") -> str | list[dict[str, Any]]:
    """Text pieces joined, or, where image parts stand among them, text and image parts in
    order."""
    if not any(isinstance(p, dict) for p in pieces):
        return separator.join(pieces)
    return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in pieces]


def _image(block: MediaBlock, where: str) -> dict[str, Any]:
    """An image block as an image part: its base64 source, or its url (fetched in planning
    only where the server allows it)."""
    return _image_of(getattr(block, "source", None), where)


def _image_of(source: Any, where: str) -> dict[str, Any]:
    if not isinstance(source, dict):
        raise InvalidRequest(f"{where}.source is required.", param=f"{where}.source")
    if source.get("type") == "base64":
        return image_part(source.get("data"), f"{where}.source.data", base64=True)
    if source.get("type") == "url":
        return image_part(source.get("url"), f"{where}.source.url")
    raise InvalidRequest(
        f"{where}.source.type must be base64 or url.", param=f"{where}.source.type"
    )


def _call(block: ToolUseBlock) -> Call:
    return Call(block.name, block.input, block.id)


# A tool's result may hold what the model cannot read (Claude Code's Read tool on a PDF) or a
# reference to a deferred tool (its ToolSearch tool): each stands as a line saying so. A 400
# there would come back with every later turn, which resends the result. Its images go to a
# vision model as images (to another, as lines saying they were left out: planning/chat.py).
LEFT_OUT = {
    "document": "[document left out: a tool's result is given to the model as text]",
    "search_result": "[search result left out]",
}


def _result(block: ToolResultBlock, where: str) -> Message:
    content = block.content
    if isinstance(content, list):
        parts, left_out = [], False
        for k, part in enumerate(content):
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "image":
                parts.append(_image_of(part.get("source"), f"{where}.content[{k}]"))
            elif kind in LEFT_OUT:
                parts.append(LEFT_OUT[kind])
                left_out = True
            elif kind == "tool_reference" and isinstance(part.get("tool_name"), str):
                # every tool is offered whole here (defer_loading is not needed)
                parts.append(f"[tool {part['tool_name']} loaded]")
                left_out = True
            else:
                raise InvalidRequest(
                    f"{where}.content[{k}] must be a text block: a tool's result is given to the "
                    "model as text.",
                    param=f"{where}.content[{k}]",
                )
        # text blocks run together as they always did; a line left out stands on its own
        content = _joined(parts, "\n" if left_out else "")
    if block.is_error:
        content = (
            f"Error: {content}"
            if isinstance(content, str)
            else [{"type": "text", "text": "Error: "}, *content]
        )
    return Message("tool", content, tool_call_id=block.tool_use_id)
