"""A conversation as every chat door hands it over (OpenAI chat, Ollama, Anthropic, Responses),
and the rules each message keeps: known roles, text content, tool results that answer a call.
Each door turns its own message shapes into these; the rules then run once, here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..api.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
MEDIA_PARTS = ("input_audio", "audio", "file", "video_url")
# An image as every door hands it over: its data URL ("url") or base64 text ("base64"), and the
# request field it came from (for a 400 that names it). Read in planning, where the model is known.
IMAGE = "image"
# What a tool's image becomes for a model that reads no images: a 400 there would come back with
# every later turn, which resends the result (Claude Code's Read of a PNG, Codex's view_image)
IMAGE_LEFT_OUT = "[image left out: a tool's result is given to the model as text]"


@dataclass(frozen=True)
class Call:
    """A call an earlier assistant turn made, sent back with the conversation."""

    name: str
    arguments: str | dict[str, Any]  # JSON text (OpenAI's) or an object
    id: str | None = None


@dataclass(frozen=True)
class Message:
    role: str
    content: str | list[dict[str, Any]] | None = None  # text, or OpenAI's content parts
    name: str | None = None
    tool_calls: tuple[Call, ...] = ()
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as one string (a list's text parts joined; checked to be text)."""
        if isinstance(self.content, list):
            # an assistant's refusal part (OpenAI's) reads as the text it is
            return "".join(
                part.get("text", part.get("refusal", ""))
                for part in self.content
                if part.get("type") != IMAGE
            )
        return self.content or ""

    def images(self) -> list[dict[str, Any]]:
        """The message's image parts, in order."""
        if not isinstance(self.content, list):
            return []
        return [part for part in self.content if part.get("type") == IMAGE]

    def images_left_out(self) -> Message:
        """The message with each image a line saying it was left out, its parts' text joined
        with those lines each on its own line."""
        if not self.images():
            return self
        pieces = [
            IMAGE_LEFT_OUT if part.get("type") == IMAGE else part.get("text", "")
            for part in self.content
        ]
        return replace(self, content="\n".join(piece for piece in pieces if piece))

    def for_template(self) -> dict[str, Any]:
        """What chat templates read: content a string (a list of text and {"type": "image"}
        parts where it holds images, as vision models' templates read them), call arguments an
        object."""
        content: Any = self.text()
        if self.images():
            content = [
                {"type": IMAGE}
                if part.get("type") == IMAGE
                else {"type": "text", "text": part.get("text", part.get("refusal", ""))}
                for part in self.content
            ]
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call.arguments)},
                }
                for call in self.tool_calls
            ]
        return message


def _arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def check_messages(messages: Sequence[Message]) -> tuple[Message, ...]:
    """Roles, text-only content, and tool results that answer a call: each a 400 naming the
    message's field. The messages come back with their calls' arguments as objects."""
    checked = []
    calls: set[str | None] | None = None  # ids of the last assistant turn's calls
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.role not in ROLES:
            raise InvalidRequest(
                f"Unknown role {message.role!r} in {where}; roles are {', '.join(ROLES)}.",
                param=f"{where}.role",
            )
        message = _check_content(message, where)
        if message.role == "tool":
            _check_tool_result(message, where, calls)
        elif message.role == "assistant" and message.tool_calls:
            message = replace(message, tool_calls=_checked_calls(message, where))
            calls = {call.id for call in message.tool_calls}
        else:
            calls = None
        checked.append(message)
    return tuple(checked)


def image_part(source: Any, param: str, base64: bool = False) -> dict[str, Any]:
    """An image part as planning reads it: `source` a data URL, or base64 text (`base64`)."""
    return {"type": IMAGE, "base64" if base64 else "url": source, "param": param}


def _check_content(message: Message, where: str) -> Message:
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise InvalidRequest(f"{where}.content is required.", param=f"{where}.content")
        return message
    if isinstance(content, str):
        return message
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        param = f"{where}.content[{j}]"
        if kind == "image_url":  # OpenAI's: {"image_url": {"url": ...}} or {"image_url": "..."}
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise InvalidRequest(
                    f"{param}.image_url.url must be a string.", param=f"{param}.image_url.url"
                )
            parts.append(image_part(url, f"{param}.image_url.url"))
            continue
        parts.append(part)
        if kind == IMAGE and ("url" in part or "base64" in part):
            continue  # a door's own image, made into a part already
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            continue
        if kind in MEDIA_PARTS:
            raise InvalidRequest(
                f"Content part type '{kind}' is not supported: audio, files and video are not "
                "read. Send text (and image) parts.",
                param=f"{param}.type",
                code="unsupported_content_type",
            )
        if kind == "text":
            raise InvalidRequest(f"{param}.text must be a string.", param=f"{param}.text")
        raise InvalidRequest(
            f"Unknown content part type {kind!r} in {param}; send {{'type': 'text', 'text': ...}}.",
            param=f"{param}.type",
        )
    return replace(message, content=parts)


def _checked_calls(message: Message, where: str) -> tuple[Call, ...]:
    """The turn's calls, their arguments parsed: JSON text that must hold an object."""
    calls = []
    for j, call in enumerate(message.tool_calls):
        arguments = call.arguments
        if isinstance(arguments, str):
            param = f"{where}.tool_calls[{j}].function.arguments"
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as error:
                raise InvalidRequest(f"{param} is not JSON: {error}", param=param) from error
            if not isinstance(arguments, dict):
                raise InvalidRequest(f"{param} must be a JSON object.", param=param)
        calls.append(replace(call, arguments=arguments))
    return tuple(calls)


def _check_tool_result(message: Message, where: str, calls: set[str | None] | None) -> None:
    if calls is None:
        raise InvalidRequest(
            f"{where} is a tool result, but no assistant message with tool_calls comes before "
            "it. Send the assistant's tool_calls turn first.",
            param=f"{where}.role",
        )
    if message.tool_call_id is None:
        raise InvalidRequest(f"{where}.tool_call_id is required.", param=f"{where}.tool_call_id")
    if None not in calls and message.tool_call_id not in calls:
        raise InvalidRequest(
            f"{where}.tool_call_id {message.tool_call_id!r} answers none of the calls before it "
            f"({', '.join(sorted(calls))}).",
            param=f"{where}.tool_call_id",
        )
