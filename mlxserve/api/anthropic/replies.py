"""Anthropic's answers: a message of content blocks (thinking, text, tool_use) with its
stop_reason and usage (cache reads from the prefix cache), whole or as Anthropic's event stream
(message_start, ping, content_block_start/delta/stop, message_delta, message_stop)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ...chat.output import AnswerSplitter, Delta, OutputSpec
from ...chat.tool_calls import ToolCall
from ...engine import EngineError, GenerationEvent
from ...planning.plan import Plan
from ..responses import SequenceResult, named_sse, note_usage


@dataclass
class Reply:
    id: str
    model: str  # as the client named it
    output: OutputSpec
    plan: Plan
    stop_sequences: list[str]

    def envelope(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def usage(self, result: SequenceResult) -> dict[str, Any]:
        """input_tokens counts what was not read from the cache, as Anthropic's does."""
        prompt = len(self.plan.prompts[0].ids)
        return {
            "input_tokens": prompt - result.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": result.cached_tokens,
            "output_tokens": result.completion_tokens,
        }

    def stop(self, result: SequenceResult, called: bool) -> dict[str, Any]:
        if result.finish_reason == "length":
            return {"stop_reason": "max_tokens", "stop_sequence": None}
        if called:
            return {"stop_reason": "tool_use", "stop_sequence": None}
        if result.stopping_word and result.stopping_word in self.stop_sequences:
            return {"stop_reason": "stop_sequence", "stop_sequence": result.stopping_word}
        return {"stop_reason": "end_turn", "stop_sequence": None}

    def message(self, result: SequenceResult, answer: Delta) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.reasoning:
            content.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
        if answer.content or not (answer.calls or answer.reasoning):
            content.append({"type": "text", "text": answer.content})
        content += [tool_use(call) for call in answer.calls]
        return {
            **self.envelope(),
            "content": content,
            **self.stop(result, bool(answer.calls)),
            "usage": self.usage(result),
        }


def tool_use(call: ToolCall, with_input: bool = True) -> dict[str, Any]:
    arguments = call.arguments_object() if with_input else {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


class Blocks:
    """The stream's content blocks: one open at a time, a new one where the kind changes."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.calls = 0

    def _start(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.stop()
        self.index += 1
        self.open = kind
        out.append(
            named_sse({"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [named_sse({"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return named_sse({"type": "content_block_delta", "index": self.index, "delta": delta})

    def feed(self, delta: Delta) -> list[str]:
        out = []
        if delta.reasoning:
            if self.open != "thinking":
                out += self._start(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            out.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.calls:
            out += self._start("tool_use", tool_use(call, with_input=False))
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
            out += self.stop()
            self.calls += 1
        return out

    def finish(self) -> list[str]:
        """Close the open block; an answer with no block at all gets an empty text block."""
        if self.index < 0:
            return self._start("text", {"type": "text", "text": ""}) + self.stop()
        return self.stop()


async def stream(events: AsyncIterator[GenerationEvent], reply: Reply) -> AsyncIterator[str]:
    result = SequenceResult()
    splitter = AnswerSplitter(reply.output)
    blocks = Blocks()
    prompt = len(reply.plan.prompts[0].ids)
    start = {**reply.envelope(), "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": prompt, "output_tokens": 0}
    yield named_sse({"type": "message_start", "message": start})
    yield named_sse({"type": "ping"})
    try:
        async for item in events:
            if item.error:
                kind = "overloaded_error" if item.unavailable else "api_error"
                yield named_sse({"type": "error", "error": {"type": kind, "message": item.error}})
                return
            result.add(item)
            delta = splitter.feed(item.text, last=bool(item.finish_reason))
            for chunk in blocks.feed(delta):
                yield chunk
            if item.finish_reason:
                for chunk in blocks.finish():
                    yield chunk
                yield named_sse(
                    {
                        "type": "message_delta",
                        "delta": reply.stop(result, blocks.calls > 0),
                        "usage": reply.usage(result),
                    }
                )
                yield named_sse({"type": "message_stop"})
    except EngineError as error:
        yield named_sse({"type": "error", "error": {"type": "api_error", "message": str(error)}})
    finally:
        note_usage(reply.plan, [result])
