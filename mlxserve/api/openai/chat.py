"""POST /v1/chat/completions (and llama.cpp's /chat/completions): OpenAI's chat, shaped from the
shared plan and results. The messages become a prompt (planning/chat.py); the answer is split into
content, reasoning and tool calls (mlxserve/chat/output.py), whole or as it streams."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, current_app
from quart_schema import document_request

from ...chat.output import AnswerSplitter, Delta, OutputSpec, split_answer
from ...engine import EngineError, GenerationEvent
from ...planning.chat import ChatPrompt, prepare
from ...planning.plan import Plan
from ...settings import ChatSettings
from ..dispatch import plan_on, ready_model, submit
from ..parsing import read_completion_request
from ..responses import (
    SSE_DONE,
    SSE_HEADERS,
    SequenceResult,
    chat_logprobs,
    collect,
    error_chunk,
    llama_timings,
    note_usage,
    prompt_progress,
    sse,
    usage,
    whole_response,
)
from .chat_protocol import ChatCompletionRequest
from .completions import FINGERPRINT

blueprint = Blueprint("openai_chat", __name__)


def chat_settings() -> ChatSettings:
    return current_app.config["SETTINGS"].chat


async def read_chat() -> tuple[Any, Any, ChatPrompt]:
    """The engine and model that serve the request, and its messages rendered."""
    request = (await read_completion_request(ChatCompletionRequest)).to_request()
    engine, loaded = await ready_model(request.model)
    chat = await asyncio.to_thread(prepare, request, loaded, chat_settings())
    return engine, loaded, chat


@blueprint.post("/v1/chat/completions")
@blueprint.post("/chat/completions")
@document_request(ChatCompletionRequest)
async def create_chat_completion():
    engine, loaded, chat = await read_chat()
    plan = await plan_on(engine, loaded, chat.request)
    meta = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": engine.model_name,
        "system_fingerprint": FINGERPRINT,
    }
    if plan.body.output.stream:
        chunks = stream_chat(submit(engine, plan), plan, chat.output, meta)
        return chunks, 200, SSE_HEADERS
    results = await collect(submit(engine, plan), plan)
    return chat_completion(results, plan, chat.output, meta)


@blueprint.post("/apply-template")
@document_request(ChatCompletionRequest)
async def apply_template():
    """llama.cpp's /apply-template: the prompt these messages render to, generating nothing."""
    *_, chat = await read_chat()
    return {"prompt": chat.text}


def chat_completion(
    results: list[SequenceResult], plan: Plan, output: OutputSpec, meta: dict[str, Any]
) -> dict[str, Any]:
    """The whole answer: n choices (with best_of, the n most likely)."""
    body, options = plan.body, plan.body.output
    candidates = results
    if plan.per_prompt > body.n:
        candidates = sorted(results, key=lambda r: -r.cumulative_logprob)[: body.n]
    choices = []
    for index, result in enumerate(candidates):
        answer = split_answer(output, result.text)
        choice = {
            "index": index,
            "message": message(answer),
            "logprobs": None,
            "finish_reason": finish_reason(result.finish_reason, answer),
        }
        if options.logprobs is not None:
            choice["logprobs"] = chat_logprobs(result.tokens, options.logprobs)
        if options.token_ids:
            choice["prompt_token_ids"] = list(plan.prompts[0].ids)
            choice["token_ids"] = result.token_ids
        choices.append(choice)
    return whole_response(meta, "chat.completion", choices, plan, results, options.timings)


def message(answer: Delta) -> dict[str, Any]:
    """The assistant's message; content is null when it only calls tools."""
    content = answer.content if answer.content or not answer.calls else None
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if answer.reasoning:
        out["reasoning_content"] = answer.reasoning
        out["reasoning"] = answer.reasoning
    if answer.calls:
        out["tool_calls"] = [tool_call(call) for call in answer.calls]
    return out


def tool_call(call, index: int | None = None) -> dict[str, Any]:
    out = {"id": call.id, "type": "function"}
    out["function"] = {"name": call.name, "arguments": call.arguments}
    return out if index is None else {"index": index, **out}


def finish_reason(reason: str | None, answer: Delta, called: bool = False) -> str | None:
    """ "tool_calls" when the model ended its turn on a call."""
    if reason == "stop" and (answer.calls or called):
        return "tool_calls"
    return reason


async def stream_chat(
    events: AsyncIterator[GenerationEvent],
    plan: Plan,
    output: OutputSpec,
    meta: dict[str, Any],
) -> AsyncIterator[str]:
    """Each choice's role first, then its content, reasoning and tool-call deltas, then one
    chunk with its finish_reason; the usage if asked; [DONE]."""
    options = plan.body.output
    results = [SequenceResult() for _ in plan.sequences]
    splitters = [AnswerSplitter(output) for _ in plan.sequences]
    calls_sent = [0] * len(plan.sequences)
    with_usage = options.usage_in_stream
    extra = {"usage": None} if with_usage else {}

    def chunk(index: int, delta: dict[str, Any], top: dict | None = None, **fields: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        choice.update(fields)
        payload = {**meta, "object": "chat.completion.chunk", "choices": [choice], **extra}
        return sse({**payload, **(top or {})})

    try:
        for index in range(len(plan.sequences)):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for event in events:
            if event.error:
                yield sse(error_chunk(event.error, event.unavailable, event.code))
                return
            index = event.index
            if event.prompt_progress is not None:  # llama.cpp's shape for it
                progress = {"prompt_progress": prompt_progress(event)}
                yield chunk(index, {"role": "assistant", "content": None}, progress)
                continue
            results[index].add(event)
            answer = splitters[index].feed(event.text, last=bool(event.finish_reason))
            delta = _delta(answer, calls_sent[index])
            calls_sent[index] += len(answer.calls)
            fields: dict[str, Any] = {}
            if options.logprobs is not None and event.tokens:
                fields["logprobs"] = chat_logprobs(event.tokens, options.logprobs)
            if options.token_ids and event.token_ids:
                fields["token_ids"] = event.token_ids
            timings = None
            if options.timings and event.timings is not None:
                timings = {"timings": llama_timings([event.timings])}
            if delta or fields:
                yield chunk(index, delta, timings, **fields)
            if event.finish_reason:
                reason = finish_reason(event.finish_reason, answer, calls_sent[index] > 0)
                yield chunk(index, {}, timings, finish_reason=reason)
        if with_usage:
            yield sse(
                {
                    **meta,
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": usage(plan, results),
                }
            )
        yield SSE_DONE
    except EngineError as error:
        yield sse(error_chunk(str(error)))
    finally:
        note_usage(plan, results)


def _delta(answer: Delta, calls_before: int) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if answer.reasoning:
        delta["reasoning_content"] = answer.reasoning
        delta["reasoning"] = answer.reasoning
    if answer.content:
        delta["content"] = answer.content
    if answer.calls:
        delta["tool_calls"] = [
            tool_call(call, calls_before + i) for i, call in enumerate(answer.calls)
        ]
    return delta
