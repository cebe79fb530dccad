"""llama.cpp's native routes, POST /completion and POST /infill, in its request and response
shapes, so editors' llama.cpp providers (llama.vim, llama.vscode, Continue, Tabby) work as is.

Both run on the same planning and engine as /v1/completions; only the shapes differ: `content`,
`stop`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `truncated`, `timings`, and
streams of bare JSON chunks with no `[DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint
from quart_schema import document_request

from ..engine import EngineError, GenerationEvent, TokenLogprob
from ..fim import InfillParts
from .completions import (
    Plan,
    SequenceResult,
    collect_results,
    error_chunk,
    generate,
    llama_timings,
    plan_request,
)
from .models import served_model_id
from .parsing import read_completion_request, sampler_names
from .schemas import InfillRequest, NativeCompletionRequest

blueprint = Blueprint("native", __name__)


@blueprint.post("/completion")
@blueprint.post("/completions")
@document_request(NativeCompletionRequest)
async def completion():
    return await respond(await read_completion_request(NativeCompletionRequest))


@blueprint.post("/infill")
@document_request(InfillRequest)
async def infill():
    body = await read_completion_request(InfillRequest)
    parts = InfillParts(
        prefix=body.input_prefix,
        suffix=body.input_suffix,
        prompt=body.prompt,
        extra=[(chunk.filename, chunk.text) for chunk in body.input_extra],
    )
    return await respond(body, parts)


async def respond(body: NativeCompletionRequest, parts: InfillParts | None = None):
    engine, loaded, plan = await plan_request(body, parts)
    model = served_model_id()  # read here: a stream runs outside the app context
    if body.stream:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return stream(generate(engine, plan), loaded, model, plan), 200, headers
    results = await collect_results(engine, plan)
    answers = [final(plan, loaded, model, i, r) for i, r in enumerate(results)]
    answers = [pick_fields(a, body.response_fields) for a in answers]
    return answers[0] if len(answers) == 1 else answers


def final(plan: Plan, loaded, model: str, index: int, result: SequenceResult) -> dict[str, Any]:
    """llama.cpp's last object of a sequence (in a stream, its text went out in the chunks)."""
    body = plan.body
    prompt = index // plan.per_prompt
    ids = plan.prompts[prompt].ids
    if result.finish_reason == "length":
        stop_type = "limit"
    else:
        stop_type = "word" if result.stopping_word else "eos"
    answer = {
        "index": index,
        "content": result.text,
        "tokens": result.token_ids if body.return_token_ids else [],
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": result.completion_tokens,
        "tokens_evaluated": len(ids),
        "generation_settings": generation_settings(body, loaded),
        # The prompt as the model saw it (a FIM template included): editors and tests read it.
        "prompt": loaded.tokenizer.decode(list(ids), skip_special_tokens=False),
        "has_new_line": "\n" in result.text,
        "truncated": plan.truncated[prompt],
        "stop_type": stop_type,
        "stopping_word": result.stopping_word or "",
        "tokens_cached": result.cached_tokens,
        "timings": llama_timings([result.timings]) if result.timings else {},
    }
    if body.logprobs is not None:
        answer["completion_probabilities"] = probabilities(result.tokens)
    return answer


def generation_settings(body: NativeCompletionRequest, loaded) -> dict[str, Any]:
    return {
        "n_ctx": loaded.context_length,
        "n_predict": body.max_tokens if body.max_tokens is not None else -1,
        "seed": body.seed if body.seed is not None else -1,
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "n_indent": body.n_indent,
        "t_max_predict_ms": body.t_max_predict_ms,
        "stop": body.stop_strings,
        "samplers": list(sampler_names(body.samplers)),
        "cache_prompt": body.cache_prompt,
    }


def probabilities(tokens: list[TokenLogprob]) -> list[dict[str, Any]]:
    """llama.cpp's `completion_probabilities` (n_probs)."""

    def entry(text: str, logprob: float | None) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {
            "id": t.token_id,
            **entry(t.text, t.logprob),
            "top_logprobs": [entry(text, lp) for text, lp in t.top.items()],
        }
        for t in tokens
    ]


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
    events: AsyncIterator[GenerationEvent], loaded, model: str, plan: Plan
) -> AsyncIterator[str]:
    """A chunk per piece of text, then the sequence's final object; no [DONE] (llama.cpp)."""
    results = [SequenceResult() for _ in plan.sequences]
    try:
        async for event in events:
            if event.error:
                yield _sse(error_chunk(event.error, event.unavailable))
                return
            result = results[event.index]
            result.text += event.text
            result.tokens += event.tokens
            result.completion_tokens = event.completion_tokens
            if event.text or event.token_ids and plan.body.return_token_ids:
                yield _sse(
                    {
                        "index": event.index,
                        "content": event.text,
                        "tokens": event.token_ids if plan.body.return_token_ids else [],
                        "stop": False,
                        "id_slot": -1,
                        "tokens_predicted": event.completion_tokens,
                        "tokens_evaluated": len(plan.prompts[event.index // plan.per_prompt].ids),
                    }
                )
            if event.finish_reason:
                result.finish_reason = event.finish_reason
                result.stopping_word = event.stopping_word
                result.cached_tokens = event.cached_tokens
                result.timings = event.timings
                answer = final(plan, loaded, model, event.index, result)
                answer["content"] = ""
                yield _sse(pick_fields(answer, plan.body.response_fields))
    except EngineError as error:
        yield _sse(error_chunk(str(error)))


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
