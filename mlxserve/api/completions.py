"""POST /v1/completions: plan the sequences, hand them to the engine, shape OpenAI's answer."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from quart import Blueprint, current_app
from quart_schema import document_request

from ..engine import (
    EngineError,
    GenerationEvent,
    GenerationRequest,
    StopSpec,
    Timings,
    TokenLogprob,
)
from ..fim import FimError, InfillParts, build_infill
from ..prompt import (
    Prompt,
    PromptError,
    first_out_of_vocabulary,
    fit_context,
    split_prompts,
    tokenize,
)
from ..sampling.breakers import resolve_breakers
from ..sampling.grammars import Constraint, GrammarError
from ..sampling.params import DryParams, SamplingParams
from ..settings import Settings
from .admission import admit, refuse_if_draining
from .constraints import constraint_of
from .errors import InvalidRequest, ServerError, ServiceUnavailable
from .metrics import timed
from .models import check_model_name, served_model_id
from .parsing import read_completion_request, sampler_names
from .schemas import CompletionRequest

blueprint = Blueprint("completions", __name__)
FINGERPRINT = "mlxserve-0.1"
LOAD_WAIT_S = 30.0  # a request waits this long for a model being (re)loaded, then gets 503


@dataclass
class Plan:
    """What one HTTP request asks of the engine: per prompt, `per_prompt` sequences."""

    body: CompletionRequest
    prompts: list[Prompt]
    sequences: list[GenerationRequest]
    per_prompt: int
    truncated: list[bool] = field(default_factory=list)  # per prompt: something did not fit


@dataclass
class SequenceResult:
    text: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stopping_word: str | None = None
    completion_tokens: int = 0
    cumulative_logprob: float = 0.0
    cached_tokens: int = 0
    timings: Timings | None = None


@blueprint.post("/v1/completions")
@document_request(CompletionRequest)
async def create_completion():
    body = await read_completion_request()
    engine, _, plan = await plan_request(body)
    meta = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": served_model_id(),
        "system_fingerprint": FINGERPRINT,
    }
    if body.stream:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return stream_completion(generate(engine, plan), plan, meta), 200, headers
    return await collect_completion(engine, plan, meta)


async def plan_request(body: CompletionRequest, infill: InfillParts | None = None):
    """The checks and planning every completion route shares: (engine, loaded model, plan)."""
    refuse_if_draining(current_app.config)
    check_model_name(body.model)
    engine = current_app.config["ENGINE"]
    settings = current_app.config["SETTINGS"]
    await engine.ensure_loaded(timeout=LOAD_WAIT_S)
    try:
        loaded = engine.check_ready()
    except EngineError as error:
        raise ServiceUnavailable(
            str(error), code="model_loading", headers={"Retry-After": "1"}
        ) from error
    constraint = constraint_of(body)
    timeout = settings.limits.grammar_timeout_s
    grammar = await compile_constraint(loaded, constraint, timeout) if constraint else None
    plan = await asyncio.to_thread(make_plan, body, loaded, settings, grammar, infill)
    admit(engine, loaded, plan.sequences, settings)
    return engine, loaded, plan


async def compile_constraint(loaded, constraint: Constraint, timeout_s: float) -> str:
    """The constraint's llguidance grammar, compiled off the event loop and bounded in time."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(loaded.grammars.compile, constraint), timeout_s
        )
    except GrammarError as error:
        raise InvalidRequest(
            f"Invalid {constraint.field}: {error}", param=constraint.field, code="invalid_grammar"
        ) from error
    except asyncio.TimeoutError as error:
        raise InvalidRequest(
            f"{constraint.field} took more than {timeout_s:g} s to compile; simplify it.",
            param=constraint.field,
            code="invalid_grammar",
        ) from error


def make_plan(
    body: CompletionRequest,
    loaded,
    settings: Settings,
    grammar: str | None = None,
    infill: InfillParts | None = None,
) -> Plan:
    """Tokenize (a FIM prompt for `suffix` or /infill's `infill`), fit the context, and expand
    prompts x best_of into GenerationRequests."""
    try:
        return _make_plan(body, loaded, settings, grammar, infill)
    except PromptError as error:
        raise InvalidRequest(str(error), param="prompt", code=error.code) from error


def _make_plan(
    body: CompletionRequest,
    loaded,
    settings: Settings,
    grammar: str | None,
    infill: InfillParts | None,
) -> Plan:
    filling = infill is not None or bool(body.suffix)
    if filling and loaded.fim is None:
        raise InvalidRequest(
            f"The model {loaded.model_id} has no fill-in-the-middle tokens, so it cannot fill in "
            "between a prefix and a suffix. Serve a code model with FIM (Qwen2.5-Coder, "
            "StarCoder2, CodeLlama, ...), or send the text before the cursor alone as the prompt.",
            param="input_suffix" if infill is not None else "suffix",
            code="fim_not_supported",
        )
    if filling and body.echo and body.logprobs is not None:
        raise InvalidRequest(
            "echo with logprobs cannot be combined with suffix: the model's prompt is the "
            "fill-in-the-middle template, not your text.",
            param="echo",
        )
    pieces = [infill.prompt] if infill is not None else split_prompts(body.prompt)
    per_prompt = body.best_of or body.n
    if len(pieces) * per_prompt > settings.limits.max_sequences_per_request:
        raise InvalidRequest(
            f"{len(pieces)} prompts x {per_prompt} choices = {len(pieces) * per_prompt} sequences; "
            f"the limit is {settings.limits.max_sequences_per_request} per request.",
            param="n",
        )
    vocab = loaded.vocab_size
    _check_token_ids(body.stop_token_ids or [], vocab, "stop_token_ids")
    _check_token_ids(body.allowed_token_ids or [], vocab, "allowed_token_ids")
    bias = {int(k): v for k, v in (body.logit_bias or {}).items()}
    _check_token_ids(list(bias), vocab, "logit_bias")
    dry = None
    if body.dry_multiplier > 0 and body.dry_penalty_last_n != 0:
        dry = DryParams(
            multiplier=body.dry_multiplier,
            base=body.dry_base,
            allowed_length=body.dry_allowed_length,
            penalty_last_n=body.dry_penalty_last_n,
            breakers=tuple(body.dry_sequence_breakers),
        )
    sampling = SamplingParams(
        temperature=body.temperature,
        top_k=max(body.top_k, 0),
        top_p=body.top_p,
        min_p=body.min_p,
        typical_p=body.typical_p,
        top_n_sigma=body.top_n_sigma,
        xtc_probability=body.xtc_probability,
        xtc_threshold=body.xtc_threshold,
        dynatemp_range=body.dynatemp_range,
        dynatemp_exponent=body.dynatemp_exponent,
        mirostat=body.mirostat,
        mirostat_tau=body.mirostat_tau,
        mirostat_eta=body.mirostat_eta,
        dry=dry,
        dry_breakers=resolve_breakers(loaded.tokenizer, dry.breakers) if dry else None,
        samplers=sampler_names(body.samplers),
        infill_end_ids=_end_of_infill(loaded) if "infill" in sampler_names(body.samplers) else (),
        logit_bias=bias,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        repeat_last_n=body.repeat_last_n,
        allowed_token_ids=tuple(body.allowed_token_ids) if body.allowed_token_ids else None,
        grammar=grammar,
    )
    stop = StopSpec(
        strings=tuple(body.stop_strings),
        token_ids=tuple(body.stop_token_ids or ()),
        include_in_output=body.include_stop_str_in_output,
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        min_indent=body.n_indent,
        max_predict_ms=body.t_max_predict_ms or None,
        deadline=_deadline(settings.limits.request_timeout_s),
    )
    needs_scores = body.best_of is not None and body.best_of > body.n
    logprobs = body.logprobs if body.logprobs is not None else (0 if needs_scores else None)
    base_seed = body.seed if body.seed not in (None, -1) else secrets.randbits(64)
    document_start = (
        loaded.bos_token_id if loaded.bos_token_id is not None else loaded.eos_token_ids[0]
    )
    prompts, sequences, truncated = [], [], []
    for piece in pieces:
        prompt = tokenize(piece, loaded.tokenizer, vocab, document_start)
        cut = False
        if filling:
            prompt, cut = _fill_in_the_middle(loaded, body, prompt, piece, infill)
        budget = fit_context(
            prompt.ids,
            body.max_tokens,
            loaded.context_length,
            body.truncate,
            body.truncate_prompt_tokens,
            settings.limits.max_prompt_tokens,
            settings.limits.max_tokens,
        )
        prompt_stop = replace(stop, min_tokens=min(stop.min_tokens, budget.max_tokens))
        fim = loaded.fim
        if fim is not None and (filling or _is_fim_prompt(fim, budget.ids)):
            # A FIM prompt's middle also ends at the template's own end tokens.
            ends = tuple(t for t in fim.stop_ids if t not in prompt_stop.token_ids)
            prompt_stop = replace(prompt_stop, token_ids=prompt_stop.token_ids + ends)
        prompts.append(Prompt(budget.ids, prompt.text))
        truncated.append(cut or budget.truncated)
        for choice in range(per_prompt):
            sequences.append(
                GenerationRequest(
                    prompt_ids=budget.ids,
                    max_tokens=budget.max_tokens,
                    sampling=sampling,
                    # Choices of one request differ; the same seed repeats the same choices.
                    seed=(base_seed + choice) % 2**64,
                    stop=prompt_stop,
                    logprobs=logprobs,
                    prompt_logprobs=body.echo and body.logprobs is not None,
                    skip_special_tokens=body.skip_special_tokens,
                    cache_prompt=body.cache_prompt,
                )
            )
    return Plan(body, prompts, sequences, per_prompt, truncated)


def _deadline(timeout_s: float | None) -> float | None:
    return time.monotonic() + timeout_s if timeout_s else None


def _fill_in_the_middle(
    loaded, body: CompletionRequest, prompt: Prompt, piece, infill: InfillParts | None
) -> tuple[Prompt, bool]:
    """The FIM prompt for `suffix` (prompt = the text before the cursor) or /infill. Echo
    still returns the user's prompt, not the template."""
    leading = _leading_ids(loaded)
    if infill is None:
        ids = list(prompt.ids)
        if ids[: len(leading)] == leading:
            ids = ids[len(leading) :]
        before = piece if isinstance(piece, str) else ids
        infill = InfillParts(prefix=before, suffix=body.suffix or "")
    max_tokens = body.max_tokens if body.max_tokens is not None else -1
    try:
        built = build_infill(
            loaded.fim,
            lambda text: _plain_ids(loaded, text),
            infill,
            loaded.context_length,
            max_tokens,
            leading,
        )
    except FimError as error:
        raise InvalidRequest(str(error), param="suffix") from error
    return Prompt(built.ids, prompt.text), built.truncated


def _plain_ids(loaded, text: str) -> list[int]:
    """Token ids of user code: special-token text in it stays text."""
    return list(loaded.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def _leading_ids(loaded) -> list[int]:
    """What the tokenizer puts before any text (BOS for Llama-style tokenizers)."""
    return [t for t in loaded.tokenizer.encode("") if t not in loaded.eos_token_ids]


def _is_fim_prompt(fim, ids: tuple[int, ...]) -> bool:
    """A raw FIM prompt (Continue, Twinny): the template's last token is in it."""
    marker = fim.middle if fim.middle is not None else fim.prefix
    return marker in ids


def _end_of_infill(loaded) -> tuple[int, ...]:
    """What the infill sampler treats as the end of the middle: EOS first, then FIM ends."""
    ends = list(loaded.eos_token_ids)
    if loaded.fim is not None:
        ends += [t for t in loaded.fim.stop_ids if t not in ends]
    return tuple(ends)


def generate(engine, plan: Plan) -> AsyncIterator[GenerationEvent]:
    """The plan's sequences handed to the engine, timed for /metrics (call it inside the
    request: a stream runs outside the app context)."""
    return timed(engine.submit(plan.sequences))


async def collect_results(engine, plan: Plan) -> list[SequenceResult]:
    """Every sequence's text, tokens and ending, once all have finished."""
    results = [SequenceResult() for _ in plan.sequences]
    async for event in generate(engine, plan):
        _raise_on_error(event)
        result = results[event.index]
        result.text += event.text
        result.tokens += event.tokens
        result.token_ids += event.token_ids
        if event.prompt_tokens is not None:
            result.prompt_tokens = event.prompt_tokens
        if event.finish_reason:
            result.finish_reason = event.finish_reason
            result.completion_tokens = event.completion_tokens
            result.cumulative_logprob = event.cumulative_logprob
            result.cached_tokens = event.cached_tokens
            result.timings = event.timings
            result.stopping_word = event.stopping_word
    return results


async def collect_completion(engine, plan: Plan, meta: dict[str, Any]) -> dict[str, Any]:
    results = await collect_results(engine, plan)
    body, choices = plan.body, []
    for p, prompt in enumerate(plan.prompts):
        candidates = results[p * plan.per_prompt : (p + 1) * plan.per_prompt]
        if plan.per_prompt > body.n:  # best_of: keep the n most likely, in that order
            candidates = sorted(candidates, key=lambda r: -r.cumulative_logprob)[: body.n]
        for c, result in enumerate(candidates):
            text = (prompt.text if body.echo else "") + result.text
            logprobs = None
            if body.logprobs is not None:
                tokens = (result.prompt_tokens or []) + result.tokens
                logprobs = legacy_logprobs(tokens, 0)
            choice = {
                "index": p * body.n + c,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
            }
            if body.return_token_ids:
                choice["prompt_token_ids"] = list(prompt.ids)
                choice["token_ids"] = result.token_ids
            choices.append(choice)
    response = {
        **meta,
        "object": "text_completion",
        "choices": choices,
        "usage": usage(
            plan,
            sum(r.completion_tokens for r in results),
            {i: r.cached_tokens for i, r in enumerate(results)},
        ),
    }
    if body.timings_per_token:
        response["timings"] = llama_timings([r.timings for r in results if r.timings])
    return response


async def stream_completion(
    events: AsyncIterator[GenerationEvent], plan: Plan, meta: dict[str, Any]
) -> AsyncIterator[str]:
    body = plan.body
    started: set[int] = set()
    started_ids: set[int] = set()
    offsets = [0] * len(plan.sequences)
    completion_tokens = 0
    cached: dict[int, int] = {}
    try:
        async for event in events:
            if event.error:
                yield _sse(error_chunk(event.error, event.unavailable))
                return
            index = event.index
            text, tokens = event.text, (event.prompt_tokens or []) + event.tokens
            if body.echo and index not in started:  # the prompt goes out with the first chunk
                started.add(index)
                text = plan.prompts[index // plan.per_prompt].text + text
            if not (
                text or tokens or event.finish_reason or body.return_token_ids and event.token_ids
            ):
                continue
            logprobs = None
            if body.logprobs is not None:
                logprobs = legacy_logprobs(tokens, offsets[index])
                offsets[index] += sum(len(t.text) for t in tokens)
            if event.finish_reason:
                completion_tokens += event.completion_tokens
                cached[index] = event.cached_tokens
            choice = {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
            if body.return_token_ids:
                if index not in started_ids:
                    started_ids.add(index)
                    choice["prompt_token_ids"] = list(plan.prompts[index // plan.per_prompt].ids)
                choice["token_ids"] = event.token_ids
            chunk = {**meta, "object": "text_completion", "choices": [choice]}
            if body.timings_per_token and event.timings is not None:
                chunk["timings"] = llama_timings([event.timings])
            yield _sse(chunk)
        if body.stream_options and body.stream_options.include_usage:
            yield _sse(
                {
                    **meta,
                    "object": "text_completion",
                    "choices": [],
                    "usage": usage(plan, completion_tokens, cached),
                }
            )
        yield "data: [DONE]\n\n"
    except EngineError as error:
        yield _sse(error_chunk(str(error)))


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


def usage(plan: Plan, completion_tokens: int, cached: dict[int, int]) -> dict[str, Any]:
    """Prompt tokens count once per prompt; so do cached ones (the best of its sequences)."""
    prompt_tokens = sum(len(p.ids) for p in plan.prompts)
    per_prompt = [0] * len(plan.prompts)
    for index, count in cached.items():
        prompt = index // plan.per_prompt
        per_prompt[prompt] = max(per_prompt[prompt], count)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(per_prompt)},
    }


def llama_timings(timings: list[Timings]) -> dict[str, Any]:
    """llama.cpp's `timings` over a request's sequences (they prefill and decode side by side)."""
    prompt_n = sum(t.prompt_tokens for t in timings)
    prompt_ms = max((t.prompt_ms for t in timings), default=0.0)
    predicted_n = sum(t.generated_tokens for t in timings)
    predicted_ms = max((t.decode_ms for t in timings), default=0.0)
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
    }


def error_chunk(message: str, unavailable: bool = False) -> dict[str, Any]:
    kind = "service_unavailable" if unavailable else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _raise_on_error(event: GenerationEvent) -> None:
    if event.error and event.unavailable:
        raise ServiceUnavailable(event.error, code="server_unavailable")
    if event.error:
        raise ServerError(event.error, code="generation_failed")


def _check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = first_out_of_vocabulary(ids, vocab_size)
    if bad is not None:
        raise InvalidRequest(
            f"token id {bad} in '{param}' is outside the vocabulary [0, {vocab_size}).",
            param=param,
        )
