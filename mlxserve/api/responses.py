"""The one response builder every front door shares: engine events -> per-sequence results, and
the pieces each wire format is made of (usage, logprobs, llama.cpp timings, SSE framing, errors).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..engine import GenerationEvent, Timings, TokenLogprob
from ..engine.requests import INVALID_IMAGE
from ..planning.plan import Plan
from . import access_log
from .errors import InvalidRequest, ServerError, ServiceUnavailable

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE_DONE = "data: [DONE]\n\n"


@dataclass
class SequenceResult:
    """One sequence's output so far: what its events added up to, and how it ended."""

    text: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: list[TokenLogprob] | None = None
    token_chars: int = 0  # characters of token text so far, the prompt's included (text_offset)
    finish_reason: str | None = None
    stopping_word: str | None = None
    completion_tokens: int = 0
    cumulative_logprob: float = 0.0
    cached_tokens: int = 0
    timings: Timings | None = None
    slot: int = -1

    def add(self, event: GenerationEvent) -> None:
        self.text += event.text
        self.tokens += event.tokens
        self.token_ids += event.token_ids
        self.slot = event.slot
        if event.prompt_tokens is not None:
            self.prompt_tokens = event.prompt_tokens
        self.token_chars += sum(len(t.text) for t in event_tokens(event))
        if event.finish_reason:
            self.finish_reason = event.finish_reason
            self.completion_tokens = event.completion_tokens
            self.cumulative_logprob = event.cumulative_logprob
            self.cached_tokens = event.cached_tokens
            self.timings = event.timings
            self.stopping_word = event.stopping_word


def event_tokens(event: GenerationEvent) -> list[TokenLogprob]:
    """The scored tokens an event carries: the prompt's (once, first) and the generated ones."""
    return (event.prompt_tokens or []) + event.tokens


async def collect(events: AsyncIterator[GenerationEvent], plan: Plan) -> list[SequenceResult]:
    """Every sequence's text, tokens and ending, once all have finished; an engine error becomes
    the request's 500 or 503."""
    results = [SequenceResult() for _ in plan.sequences]
    try:
        async for event in events:
            raise_on_error(event)
            results[event.index].add(event)
    finally:
        note_usage(plan, results)
    return results


def raise_on_error(event: GenerationEvent) -> None:
    if event.error and event.unavailable:
        raise ServiceUnavailable(event.error, code=event.code or "server_unavailable")
    if event.error and event.code == INVALID_IMAGE:
        raise InvalidRequest(event.error, param="messages", code=INVALID_IMAGE)
    if event.error:
        raise ServerError(event.error, code="generation_failed")


def usage(plan: Plan, results: list[SequenceResult]) -> dict[str, Any]:
    """Prompt tokens count once per prompt; so do cached ones (the best of its sequences)."""
    prompt_tokens = sum(len(p.ids) for p in plan.prompts)
    completion_tokens = sum(r.completion_tokens for r in results)
    cached = [0] * len(plan.prompts)
    for index, result in enumerate(results):
        prompt = index // plan.per_prompt
        cached[prompt] = max(cached[prompt], result.cached_tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(cached)},
    }


def note_usage(plan: Plan, results: list[SequenceResult]) -> None:
    """The request's token counts for its access-log line; a sequence cut short counts the
    tokens it had generated."""
    counts = usage(plan, results)
    generated = sum(max(r.completion_tokens, len(r.token_ids)) for r in results)
    drafts = draft_counts([r.timings for r in results if r.timings is not None])
    access_log.note_tokens(
        counts["prompt_tokens"], generated, counts["prompt_tokens_details"]["cached_tokens"], drafts
    )


def draft_counts(timings: list[Timings]) -> tuple[int, int]:
    """Speculative decoding's tokens drafted and verified for a request's sequences, and kept."""
    return sum(t.draft_tokens for t in timings), sum(t.draft_accepted for t in timings)


def legacy_logprobs(tokens: list[TokenLogprob], start_offset: int) -> dict[str, list]:
    """OpenAI's legacy completions logprobs: four parallel lists."""
    offsets, position = [], start_offset
    for token in tokens:
        offsets.append(position)
        position += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [t.top if t.logprob is not None else None for t in tokens],
        "text_offset": offsets,
    }


def completion_probabilities(
    tokens: list[TokenLogprob], post_sampling: bool = False
) -> list[dict[str, Any]]:
    """llama.cpp's `completion_probabilities` (n_probs): per token its id, text, bytes and
    logprob, and the top alternatives alike; with post_sampling_probs, `prob` and `top_probs`
    (probabilities after the sampler chain, only the tokens it kept)."""
    value, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def entry(token_id: int, text: str, logprob: float | None) -> dict[str, Any]:
        number = logprob
        if post_sampling and logprob is not None:
            number = math.exp(logprob)
        return {"id": token_id, "token": text, "bytes": list(text.encode()), value: number}

    return [
        {
            **entry(t.token_id, t.text, t.logprob),
            top: [entry(a.token_id, a.text, a.logprob) for a in t.alternatives],
        }
        for t in tokens
    ]


def chat_logprobs(tokens: list[TokenLogprob], top: int) -> dict[str, Any]:
    """OpenAI chat's `logprobs`: per token its text, logprob, bytes and `top` alternatives."""

    def entry(text: str, logprob: float | None) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {
                **entry(t.text, t.logprob),
                "top_logprobs": [entry(text, lp) for text, lp in list(t.top.items())[:top]],
            }
            for t in tokens
        ]
    }


def prompt_progress(event: GenerationEvent) -> dict[str, Any]:
    """llama.cpp's `prompt_progress` of a progress event (return_progress)."""
    p = event.prompt_progress
    return {
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": round(p.time_ms, 3),
    }


def llama_timings(timings: list[Timings]) -> dict[str, Any]:
    """llama.cpp's `timings` over a request's sequences (they prefill and decode side by side)."""
    prompt_n = sum(t.prompt_tokens for t in timings)
    prompt_ms = max((t.prompt_ms for t in timings), default=0.0)
    predicted_n = sum(t.generated_tokens for t in timings)
    predicted_ms = max((t.decode_ms for t in timings), default=0.0)
    drafted, accepted = draft_counts(timings)
    drafts = {}
    if drafted:  # as llama.cpp: only where speculative decoding ran
        drafts = {"draft_n": drafted, "draft_n_accepted": accepted}
    return {
        "cache_n": sum(t.cached_tokens for t in timings),
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / max(prompt_n, 1), 3),
        "prompt_per_second": round(prompt_n / prompt_ms * 1000, 3) if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / max(predicted_n, 1), 3),
        "predicted_per_second": round(predicted_n / predicted_ms * 1000, 3)
        if predicted_ms
        else 0.0,
        **drafts,
    }


def whole_response(
    meta: dict[str, Any],
    kind: str,
    choices: list[dict[str, Any]],
    plan: Plan,
    results: list[SequenceResult],
    with_timings: bool,
) -> dict[str, Any]:
    """OpenAI's unstreamed answer around its choices: `meta` (id, created, model, ...), the
    object `kind`, usage, and llama.cpp's timings when asked."""
    response = {**meta, "object": kind, "choices": choices, "usage": usage(plan, results)}
    if with_timings:
        response["timings"] = llama_timings([r.timings for r in results if r.timings])
    return response


def error_chunk(message: str, unavailable: bool = False, code: str | None = None) -> dict[str, Any]:
    """A stream's last chunk when generation fails after the 200 went out."""
    kind = "service_unavailable" if unavailable else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# Unicode's line breaks that JSON leaves raw: readers that split a stream with str.splitlines
# (httpx's iter_lines, so the `ollama` client) would cut an event inside its text.
_RAW_LINE_BREAKS = (("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def stream_json(payload: dict[str, Any]) -> str:
    """One streamed object as compact JSON on one line for every reader: text as is (not
    \\u-escaped) but for Unicode's line breaks (Go's encoding/json, so Ollama, escapes two)."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in _RAW_LINE_BREAKS:
        if char in data:
            data = data.replace(char, escaped)
    return data


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {stream_json(payload)}\n\n"


def named_sse(payload: dict[str, Any]) -> str:
    """One server-sent event named by its payload's type on an `event:` line, as Anthropic's
    Messages stream and OpenAI's Responses stream send them."""
    return f"event: {payload['type']}\ndata: {stream_json(payload)}\n\n"
