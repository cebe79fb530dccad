"""Ollama's answers: NDJSON streams of pieces, the final object with its done_reason and
durations in nanoseconds, and whole answers. /api/generate puts the text in `response` and
reasoning in `thinking`; /api/chat puts both, and tool calls, in `message`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ...chat.output import AnswerSplitter, Delta, OutputSpec, split_answer
from ...chat.tool_calls import ToolCall
from ...engine import EngineError, GenerationEvent
from ...planning.plan import Plan
from ..responses import SequenceResult, chat_logprobs, collect, note_usage, stream_json
from .shape import rfc3339

NDJSON_HEADERS = {"Content-Type": "application/x-ndjson"}


@dataclass
class Clock:
    """A request's time so far, in Ollama's nanoseconds: since it arrived, and loading."""

    started: int = field(default_factory=time.perf_counter_ns)
    load_ns: int = 0

    def elapsed(self) -> int:
        return time.perf_counter_ns() - self.started


@dataclass
class Reply:
    """How one request's answer is shaped, and what happens once it ends (`after`: the
    model's keep_alive)."""

    model: str  # as the client named it: Ollama echoes it
    chat: bool  # /api/chat's `message`, else /api/generate's `response`
    output: OutputSpec | None  # how the text splits (None: all of it is the response)
    plan: Plan
    clock: Clock
    after: Callable[[], None]
    logprobs: int | None = None  # alternatives per token when the client asked for logprobs
    context: bool = False  # /api/generate's `context`: the prompt's and answer's token ids

    def head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": rfc3339(time.time())}

    def piece(self, delta: Delta) -> dict[str, Any]:
        if not self.chat:
            out: dict[str, Any] = {"response": delta.content}
            if delta.reasoning:
                out["thinking"] = delta.reasoning
            return out
        message: dict[str, Any] = {"role": "assistant", "content": delta.content}
        if delta.reasoning:
            message["thinking"] = delta.reasoning
        if delta.calls:
            message["tool_calls"] = [ollama_call(call) for call in delta.calls]
        return {"message": message}

    def final(self, result: SequenceResult, delta: Delta) -> dict[str, Any]:
        """The last object: done, why, the durations, and (generate) the context."""
        answer = {**self.head(), **self.piece(delta), "done": True}
        answer["done_reason"] = "length" if result.finish_reason == "length" else "stop"
        timings = result.timings
        answer.update(
            total_duration=self.clock.elapsed(),
            load_duration=self.clock.load_ns,
            prompt_eval_count=len(self.plan.prompts[0].ids),
            prompt_eval_duration=int(timings.prompt_ms * 1e6) if timings else 0,
            eval_count=result.completion_tokens,
            eval_duration=int(timings.decode_ms * 1e6) if timings else 0,
        )
        if self.context:
            answer["context"] = [*self.plan.prompts[0].ids, *result.token_ids]
        return answer

    def split(self, text: str) -> Delta:
        return split_answer(self.output, text) if self.output else Delta(content=text)


def ollama_call(call: ToolCall) -> dict[str, Any]:
    """A call as Ollama writes it: arguments an object, not a string."""
    return {"id": call.id, "function": {"name": call.name, "arguments": call.arguments_object()}}


def line(payload: dict[str, Any]) -> str:
    return stream_json(payload) + "\n"


async def whole(events: AsyncIterator[GenerationEvent], reply: Reply) -> dict[str, Any]:
    """The answer in one object (`stream: false`)."""
    try:
        (result,) = await collect(events, reply.plan)
    finally:
        reply.after()
    answer = reply.final(result, reply.split(result.text))
    if reply.logprobs is not None:
        answer["logprobs"] = chat_logprobs(result.tokens, reply.logprobs)["content"]
    return answer


async def stream(events: AsyncIterator[GenerationEvent], reply: Reply) -> AsyncIterator[str]:
    """One line per piece of text, then the final object; an error after the 200 is a line
    `{"error": ...}`, as Ollama writes it."""
    result = SequenceResult()
    splitter = AnswerSplitter(reply.output) if reply.output else None
    try:
        async for event in events:
            if event.error:
                yield line({"error": event.error})
                return
            result.add(event)
            last = bool(event.finish_reason)
            delta = splitter.feed(event.text, last) if splitter else Delta(content=event.text)
            scored = reply.logprobs is not None and event.tokens
            if delta or scored:
                chunk = {**reply.head(), **reply.piece(delta), "done": False}
                if scored:
                    chunk["logprobs"] = chat_logprobs(event.tokens, reply.logprobs)["content"]
                yield line(chunk)
            if event.finish_reason:
                yield line(reply.final(result, Delta()))
    except EngineError as error:
        yield line({"error": str(error)})
    finally:
        note_usage(reply.plan, [result])
        reply.after()
