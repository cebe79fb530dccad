"""POST /v1/responses: OpenAI's Responses API, stateless, over the chat path. The body becomes a
chat request (responses_protocol.py); the answer, split as chat splits it, becomes output items:
reasoning, one message, then the function calls, whole or as a stream of typed events."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, current_app
from quart_schema import document_request

from ...chat.output import AnswerSplitter, Delta, OutputSpec, split_answer
from ...chat.tool_calls import ToolCall
from ...engine import EngineError, GenerationEvent
from ...planning.chat import prepare
from ...planning.plan import Plan
from ..dispatch import plan_on, ready_model, submit
from ..parsing import read_json_object, validate
from ..responses import SSE_HEADERS, SequenceResult, collect, named_sse, note_usage, usage
from .responses_protocol import ResponsesRequest, ToolOrigin, chat_request

blueprint = Blueprint("openai_responses", __name__)

# Per kind of text item: its empty item, its content part, and its delta and done events.
TEXT_ITEMS = {
    "reasoning": (
        {"type": "reasoning", "summary": []},
        {"type": "reasoning_text", "text": ""},
        "response.reasoning_text",
    ),
    "message": (
        {"type": "message", "status": "in_progress", "role": "assistant"},
        {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        "response.output_text",
    ),
}
ID_PREFIXES = {"reasoning": "rs", "message": "msg"}


@blueprint.post("/v1/responses")
@document_request(ResponsesRequest)
async def create_response():
    settings = current_app.config["SETTINGS"]
    body = validate(ResponsesRequest, await read_json_object(), settings.limits)
    chat, origins = chat_request(body, settings.chat.strict_tools)
    engine, loaded = await ready_model(chat.model)
    prompt = await asyncio.to_thread(prepare, chat, loaded, settings.chat)
    plan = await plan_on(engine, loaded, prompt.request)
    response = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": engine.model_name,
        "output": [],
        "previous_response_id": None,
        "service_tier": "default",
        "store": False,
        "usage": None,
        **body.echo(),
    }
    if body.stream:
        return (
            stream_response(submit(engine, plan), plan, prompt.output, response, origins),
            200,
            SSE_HEADERS,
        )
    (result,) = await collect(submit(engine, plan), plan)
    output = Output(origins)
    output.add(split_answer(prompt.output, result.text))
    output.finish(result.finish_reason)
    return finished(response, output, plan, result)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class Output:
    """The output items, built from the answer's pieces as they come; each step returns the
    events a stream sends for it. Calls go out last, so a stream orders items as a whole
    response does whatever text follows a call."""

    def __init__(self, origins: dict[str, ToolOrigin] | None = None) -> None:
        self.origins = origins or {}  # calls of a custom tool's or a namespace's function
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the text item being written
        self.has_message = False
        self.calls: list[ToolCall] = []

    def add(self, delta: Delta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, text in (("reasoning", delta.reasoning), ("message", delta.content)):
            if text:
                events += self._write(kind, text)
        self.calls += delta.calls
        return events

    def finish(self, finish_reason: str | None) -> list[dict[str, Any]]:
        """Close the text item; an answer of no text and no calls is an empty message."""
        status = "incomplete" if finish_reason == "length" else "completed"
        events = self._close(status)
        if not self.has_message and not self.calls:
            events += self._open("message") + self._close(status)
        for call in self.calls:
            events += self._call(call)
        return events

    def _write(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self._close("completed") + self._open(kind)
        item = self.open
        item["content"][0]["text"] += text
        delta = {"type": f"{TEXT_ITEMS[kind][2]}.delta", **self._where(item), "delta": text}
        if kind == "message":
            delta["logprobs"] = []
        return [*events, delta]

    def _open(self, kind: str) -> list[dict[str, Any]]:
        empty, part, _ = TEXT_ITEMS[kind]
        item = {"id": new_id(ID_PREFIXES[kind]), **empty, "content": []}
        self.items.append(item)
        self.open, self.has_message = item, self.has_message or kind == "message"
        added = {"type": "response.output_item.added", **self._index(item), "item": snap(item)}
        item["content"].append(copy.deepcopy(part))
        return [added, {"type": "response.content_part.added", **self._where(item), "part": part}]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        part = item["content"][0]
        done = {"type": f"{TEXT_ITEMS[item['type']][2]}.done", **self._where(item)}
        done["text"] = part["text"]
        if item["type"] == "message":
            item["status"] = status
            done["logprobs"] = []
        return [
            done,
            {"type": "response.content_part.done", **self._where(item), "part": snap(part)},
            {"type": "response.output_item.done", **self._index(item), "item": snap(item)},
        ]

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        """A call's item and its events: a function_call with its arguments, or a custom tool's
        custom_tool_call with its `input` argument as the raw input the client reads."""
        origin = self.origins.get(call.name, ToolOrigin())
        if origin.custom:
            kind, prefix, field, events = (
                "custom_tool_call",
                "ctc",
                "input",
                "custom_tool_call_input",
            )
            value = _custom_input(call.arguments)
        else:
            kind, prefix, field, events = (
                "function_call",
                "fc",
                "arguments",
                "function_call_arguments",
            )
            value = call.arguments
        item = {
            "id": new_id(prefix),
            "type": kind,
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            field: "",
        }
        if origin.namespace is not None:
            item["namespace"] = origin.namespace
        self.items.append(item)
        where = {"item_id": item["id"], **self._index(item)}
        added = {"type": "response.output_item.added", **self._index(item), "item": snap(item)}
        delta = {"type": f"response.{events}.delta", **where, "delta": value}
        item.update({field: value, "status": "completed"})
        done = {"type": f"response.{events}.done", **where, field: value}
        if not origin.custom:
            done["name"] = call.name
        return [
            added,
            delta,
            done,
            {"type": "response.output_item.done", **self._index(item), "item": snap(item)},
        ]

    def _index(self, item: dict[str, Any]) -> dict[str, int]:
        return {"output_index": next(i for i, x in enumerate(self.items) if x is item)}

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], **self._index(item), "content_index": 0}


def _custom_input(arguments: str) -> str:
    """The `input` string of a custom tool's call, offered as a function of one (the arguments
    as they are where they hold none)."""
    try:
        text = json.loads(arguments).get("input")
    except (ValueError, AttributeError):
        text = None
    return text if isinstance(text, str) else arguments


def snap(value: dict[str, Any]) -> dict[str, Any]:
    """A copy as it is now: the item goes on changing after the event that carries it."""
    return copy.deepcopy(value)


def finished(
    response: dict[str, Any], output: Output, plan: Plan, result: SequenceResult
) -> dict[str, Any]:
    """The response once the answer ended: its status, output items and usage."""
    incomplete = result.finish_reason == "length"
    counts = usage(plan, [result])
    return {
        **response,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": snap({"items": output.items})["items"],
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": counts["prompt_tokens_details"],
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
    }


def failed(response: dict[str, Any], output: Output, message: str) -> dict[str, Any]:
    failure = {"code": "server_error", "message": message}
    return {**response, "status": "failed", "error": failure, "output": output.items}


async def stream_response(
    events: AsyncIterator[GenerationEvent],
    plan: Plan,
    spec: OutputSpec,
    response: dict[str, Any],
    origins: dict[str, ToolOrigin] | None = None,
) -> AsyncIterator[str]:
    """response.created and .in_progress, each item's events, then response.completed (or
    .incomplete) with the whole response; an engine error is response.failed."""
    numbers = itertools.count()
    result = SequenceResult()
    splitter = AnswerSplitter(spec)
    output = Output(origins)

    def send(event: dict[str, Any]) -> str:
        event = {"type": event["type"], "sequence_number": next(numbers), **event}
        return named_sse(event)

    try:
        yield send({"type": "response.created", "response": response})
        yield send({"type": "response.in_progress", "response": response})
        async for event in events:
            if event.error:
                yield send(
                    {"type": "response.failed", "response": failed(response, output, event.error)}
                )
                return
            result.add(event)
            delta = splitter.feed(event.text, last=bool(event.finish_reason))
            for item_event in output.add(delta):
                yield send(item_event)
            if event.finish_reason:
                for item_event in output.finish(event.finish_reason):
                    yield send(item_event)
                final = finished(response, output, plan, result)
                yield send({"type": f"response.{final['status']}", "response": final})
    except EngineError as error:
        yield send({"type": "response.failed", "response": failed(response, output, str(error))})
    finally:
        note_usage(plan, [result])
