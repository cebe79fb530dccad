"""llama.cpp's POST /completion in its request and response shapes, so editors' llama.cpp
providers (llama.vim, llama.vscode, Continue, Tabby) work as is.

Same planning and engine as /v1/completions; only the shapes differ: `content`, `stop`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `truncated`, `timings`, and streams of
bare JSON chunks with no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint
from quart_schema import document_request

from ...engine import EngineError, GenerationEvent
from ...planning.defaults import fills_context
from ...planning.plan import Plan
from ..dispatch import plan_request, submit
from ..errors import InvalidRequest
from ..parsing import read_completion_request
from ..responses import (
    SSE_HEADERS,
    SequenceResult,
    collect,
    completion_probabilities,
    error_chunk,
    llama_timings,
    note_usage,
    prompt_progress,
    sse,
)
from .protocol import NativeCompletionRequest

blueprint = Blueprint("llamacpp_completion", __name__)
CONTEXT_ERRORS = ("context_length_exceeded", "prompt_too_long")


@blueprint.post("/completion")
@blueprint.post("/completions")
@document_request(NativeCompletionRequest)
async def completion():
    return await respond(await read_completion_request(NativeCompletionRequest))


async def respond(body: NativeCompletionRequest):
    """Plan, generate and answer in llama.cpp's shapes (/completion, and /infill's subclass)."""
    try:
        engine, loaded, plan = await plan_request(body.to_request())
    except InvalidRequest as error:
        if error.code in CONTEXT_ERRORS:  # llama.cpp's type, which its web UI looks for
            error.type = "exceed_context_size_error"
        raise
    model = engine.model_name  # read here: a stream runs outside the app context
    if body.stream:
        return stream(submit(engine, plan), body, loaded, model, plan), 200, SSE_HEADERS
    results = await collect(submit(engine, plan), plan)
    answers = [final(plan, body, loaded, model, i, r) for i, r in enumerate(results)]
    answers = [pick_fields(a, body.response_fields) for a in answers]
    return answers[0] if len(answers) == 1 else answers


def final(
    plan: Plan,
    body: NativeCompletionRequest,
    loaded,
    model: str,
    index: int,
    result: SequenceResult,
) -> dict[str, Any]:
    """llama.cpp's last object of a sequence."""
    prompt = index // plan.per_prompt
    ids = plan.prompts[prompt].ids
    context_full = (
        result.finish_reason == "length"
        and len(ids) + result.completion_tokens >= loaded.context_length
    )
    if result.finish_reason == "length":
        stop_type = "limit"
    else:
        stop_type = "word" if result.stopping_word else "eos"
    answer = {
        "index": index,
        "content": result.text,
        "tokens": result.token_ids if body.return_token_ids else [],
        "id_slot": result.slot,
        "stop": True,
        "model": model,
        "tokens_predicted": result.completion_tokens,
        "tokens_evaluated": len(ids),
        "generation_settings": generation_settings(body, loaded),
        # The prompt as the model saw it (a FIM template included): editors and tests read it.
        "prompt": loaded.tokenizer.decode(list(ids), skip_special_tokens=False),
        "has_new_line": "\n" in result.text,
        # llama.cpp's sense: part of the prompt was cut, or the context filled up.
        "truncated": plan.truncated[prompt] or context_full,
        "stop_type": stop_type,
        "stopping_word": result.stopping_word or "",
        "tokens_cached": result.cached_tokens,
        "timings": llama_timings([result.timings]) if result.timings else {},
    }
    if body.logprobs:  # llama.cpp's n_probs: 0 is none
        answer["completion_probabilities"] = completion_probabilities(
            result.tokens, body.post_sampling_probs
        )
    return answer


def generation_settings(body: NativeCompletionRequest, loaded) -> dict[str, Any]:
    return {
        "n_ctx": loaded.context_length,
        "n_predict": -1 if fills_context(body.max_tokens) else body.max_tokens,
        "seed": body.seed if body.seed is not None else -1,
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "n_indent": body.n_indent,
        "t_max_predict_ms": body.t_max_predict_ms,
        "stop": body.stop_strings,
        "samplers": list(body.samplers),
        "cache_prompt": body.cache_prompt,
    }


def pick_fields(answer: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama.cpp's `response_fields`: only those, nested ones under their path ('timings/x')."""
    if not fields:
        return answer
    picked = {}
    for path in fields:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


async def stream(
    events: AsyncIterator[GenerationEvent],
    body: NativeCompletionRequest,
    loaded,
    model: str,
    plan: Plan,
) -> AsyncIterator[str]:
    """A chunk per piece of text, then the sequence's final object; no [DONE] (llama.cpp)."""
    results = [SequenceResult() for _ in plan.sequences]
    try:
        async for event in events:
            if event.error:
                yield sse(error_chunk(event.error, event.unavailable, event.code))
                return
            result = results[event.index]
            if event.prompt_progress is not None:
                yield sse(
                    {
                        "index": event.index,
                        "content": "",
                        "tokens": [],
                        "stop": False,
                        "id_slot": event.slot,
                        "tokens_predicted": 0,
                        "tokens_evaluated": len(plan.prompt_of(event.index).ids),
                        "prompt_progress": prompt_progress(event),
                    }
                )
                continue
            result.add(event)
            if event.text or event.token_ids:
                # As llama.cpp: every token's id goes out (a stop word held back: no text yet).
                chunk = {
                    "index": event.index,
                    "content": event.text,
                    "tokens": event.token_ids,
                    "stop": False,
                    "id_slot": event.slot,
                    "tokens_predicted": event.completion_tokens,
                    "tokens_evaluated": len(plan.prompt_of(event.index).ids),
                }
                if body.logprobs and event.tokens:
                    chunk["completion_probabilities"] = completion_probabilities(
                        event.tokens, body.post_sampling_probs
                    )
                if body.timings_per_token and event.timings is not None:
                    chunk["timings"] = llama_timings([event.timings])
                yield sse(chunk)
            if event.finish_reason:
                # As llama.cpp: text, tokens and probabilities went out in the chunks.
                answer = {**final(plan, body, loaded, model, event.index, result), "content": ""}
                answer["tokens"] = []
                answer.pop("completion_probabilities", None)
                yield sse(pick_fields(answer, body.response_fields))
    except EngineError as error:
        yield sse(error_chunk(str(error)))
    finally:
        note_usage(plan, results)
