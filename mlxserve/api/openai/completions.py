"""POST /v1/completions: OpenAI's legacy completions, shaped from the shared plan and results."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint
from quart_schema import document_request

from ...engine import EngineError, GenerationEvent
from ...planning.plan import Plan
from ..dispatch import plan_request, submit
from ..parsing import read_completion_request
from ..protocol import CompletionRequest
from ..responses import (
    SSE_DONE,
    SSE_HEADERS,
    SequenceResult,
    collect,
    error_chunk,
    event_tokens,
    legacy_logprobs,
    llama_timings,
    note_usage,
    prompt_progress,
    sse,
    usage,
    whole_response,
)

blueprint = Blueprint("openai_completions", __name__)
FINGERPRINT = "mlxserve-0.1"


@blueprint.post("/v1/completions")
@document_request(CompletionRequest)
async def create_completion():
    request = (await read_completion_request()).to_request()
    engine, _, plan = await plan_request(request)
    meta = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": engine.model_name,
        "system_fingerprint": FINGERPRINT,
    }
    if request.output.stream:
        return stream_completion(submit(engine, plan), plan, meta), 200, SSE_HEADERS
    return completion(await collect(submit(engine, plan), plan), plan, meta)


def completion(results: list[SequenceResult], plan: Plan, meta: dict[str, Any]) -> dict[str, Any]:
    """The whole answer: per prompt its n choices (with best_of, the n most likely)."""
    body, choices = plan.body, []
    output = body.output
    for p, prompt in enumerate(plan.prompts):
        candidates = results[p * plan.per_prompt : (p + 1) * plan.per_prompt]
        if plan.per_prompt > body.n:
            candidates = sorted(candidates, key=lambda r: -r.cumulative_logprob)[: body.n]
        for c, result in enumerate(candidates):
            choice = {
                "index": p * body.n + c,
                "text": (prompt.text if output.echo else "") + result.text,
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
            if output.logprobs is not None:
                choice["logprobs"] = legacy_logprobs(
                    (result.prompt_tokens or []) + result.tokens, 0
                )
            if output.token_ids:
                choice["prompt_token_ids"] = list(prompt.ids)
                choice["token_ids"] = result.token_ids
            choices.append(choice)
    return whole_response(meta, "text_completion", choices, plan, results, output.timings)


async def stream_completion(
    events: AsyncIterator[GenerationEvent], plan: Plan, meta: dict[str, Any]
) -> AsyncIterator[str]:
    """A chunk per event that adds something, the usage if asked, then [DONE]."""
    output = plan.body.output
    results = [SequenceResult() for _ in plan.sequences]
    echoed: set[int] = set()  # the prompt goes out with a sequence's first chunk
    sent_prompt_ids: set[int] = set()
    try:
        async for event in events:
            if event.error:
                yield sse(error_chunk(event.error, event.unavailable, event.code))
                return
            index, result = event.index, results[event.index]
            if event.prompt_progress is not None:
                choice = {"index": index, "text": "", "logprobs": None, "finish_reason": None}
                yield sse(
                    {
                        **meta,
                        "object": "text_completion",
                        "choices": [choice],
                        "prompt_progress": prompt_progress(event),
                    }
                )
                continue
            offset = result.token_chars
            result.add(event)
            text, tokens = event.text, event_tokens(event)
            if output.echo and index not in echoed:
                echoed.add(index)
                text = plan.prompt_of(index).text + text
            if not (text or tokens or event.finish_reason or output.token_ids and event.token_ids):
                continue
            choice = {
                "index": index,
                "text": text,
                "logprobs": legacy_logprobs(tokens, offset)
                if output.logprobs is not None
                else None,
                "finish_reason": event.finish_reason,
            }
            if output.token_ids:
                if index not in sent_prompt_ids:
                    sent_prompt_ids.add(index)
                    choice["prompt_token_ids"] = list(plan.prompt_of(index).ids)
                choice["token_ids"] = event.token_ids
            chunk = {**meta, "object": "text_completion", "choices": [choice]}
            if output.timings and event.timings is not None:
                chunk["timings"] = llama_timings([event.timings])
            yield sse(chunk)
        if output.usage_in_stream:
            yield sse(
                {
                    **meta,
                    "object": "text_completion",
                    "choices": [],
                    "usage": usage(plan, results),
                }
            )
        yield SSE_DONE
    except EngineError as error:
        yield sse(error_chunk(str(error)))
    finally:
        note_usage(plan, results)
