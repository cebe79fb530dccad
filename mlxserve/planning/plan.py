"""The one planning step every front door shares: a validated request -> the engine's work.

Prompts (text, token ids, or llama.cpp's mix) become token ids; `suffix` and /infill become the
model's fill-in-the-middle prompt; the context policy fits each prompt; and prompts x best_of
become one GenerationRequest per sequence. No Quart: the caller (api/dispatch.py) passes the
server's settings and the loaded model.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..api.errors import InvalidRequest
from ..engine import GenerationRequest, StopSpec
from ..fim import FimError, InfillParts, build_infill, fim_token_names
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
from ..sampling.params import SamplingParams
from ..sampling.token_healing import heal
from ..settings import Settings
from .defaults import random_seed
from .media_prompt import with_media
from .request import LogitBias, Request


@dataclass
class Plan:
    """What one HTTP request asks of the engine: per prompt, `per_prompt` sequences."""

    body: Request  # the canonical request (a chat's with its prompt rendered)
    prompts: list[Prompt]
    sequences: list[GenerationRequest]
    per_prompt: int
    truncated: list[bool] = field(default_factory=list)  # per prompt: something did not fit
    reservation: int | None = None  # its place among the sequences in flight (admission)

    def prompt_of(self, index: int) -> Prompt:
        """The prompt the sequence at `index` continues."""
        return self.prompts[index // self.per_prompt]


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
    body: Request,
    loaded,
    settings: Settings,
    grammar: str | None = None,
) -> Plan:
    """Tokenize (a FIM prompt for `suffix` or /infill's parts), fit the context, and expand
    prompts x best_of into GenerationRequests; `grammar` is the request's compiled constraint."""
    try:
        return _make_plan(body, loaded, settings, grammar)
    except PromptError as error:
        raise InvalidRequest(
            str(error), param=error.param, code=error.code, details=error.details
        ) from error


def _make_plan(body: Request, loaded, settings: Settings, grammar: str | None) -> Plan:
    if body.media:
        body = with_media(body, loaded, settings.chat)
    infill = body.infill
    if infill is not None and loaded.fim is None and not infill.suffix:
        # Nothing after the cursor: a model without FIM tokens continues the text before it.
        pieces, infill = [infill.prefix + infill.prompt], None
    else:
        pieces = [infill.prompt] if infill is not None else split_prompts(body.prompt)
    filling = infill is not None or bool(body.suffix)
    if filling:
        _check_filling(body, loaded, infill, settings)
    per_prompt = body.best_of or body.n
    limit = settings.limits.max_sequences_per_request
    if len(pieces) * per_prompt > limit:
        raise InvalidRequest(
            f"{len(pieces)} prompts x {per_prompt} choices = {len(pieces) * per_prompt} sequences; "
            f"the limit is {limit} per request.",
            param="n",
        )
    vocab = loaded.vocab_size
    _check_token_ids(list(body.stop.token_ids), vocab, "stop_token_ids")
    _check_token_ids(list(body.sampling.allowed_token_ids or ()), vocab, "allowed_token_ids")
    sampling = sampling_for(body, loaded.tokenizer, _end_of_infill(loaded), grammar)
    _check_token_ids(list(sampling.logit_bias), vocab, "logit_bias")
    stop = replace(body.stop, deadline=_deadline(settings.limits.request_timeout_s))
    output = body.output
    needs_scores = body.best_of is not None and body.best_of > body.n
    logprobs = output.logprobs if output.logprobs is not None else (0 if needs_scores else None)
    base_seed = random_seed(body.seed)
    document_start = (
        loaded.bos_token_id if loaded.bos_token_id is not None else loaded.eos_token_ids[0]
    )
    plan = Plan(body, [], [], per_prompt)
    for piece in pieces:
        prompt = tokenize(piece, loaded.tokenizer, vocab, document_start)
        cut, healed = False, ""
        if filling:
            prompt, cut, healed = _fill_in_the_middle(
                loaded, body, prompt, piece, infill, healing=grammar is None
            )
        budget = fit_context(
            prompt.ids,
            body.max_tokens,
            loaded.context_length - body.image_tokens,
            body.fit.truncate,
            body.fit.keep_last,
            settings.limits.max_prompt_tokens,
            settings.limits.max_tokens,
            strict=settings.strict_context,
            keep_first=_kept_head(loaded, prompt.ids, body.fit.keep_first),
        )
        if body.images and budget.truncated:
            raise InvalidRequest(
                "The conversation with its images does not fit the context window, and a "
                "prompt with images is not cut short. Send fewer messages or a smaller "
                "max_tokens.",
                param="messages",
                code="context_length_exceeded",
            )
        prompt_stop = _stop_for(loaded, stop, budget.ids, budget.max_tokens, filling)
        plan.prompts.append(Prompt(budget.ids, prompt.text))
        plan.truncated.append(cut or budget.truncated)
        for choice in range(per_prompt):
            plan.sequences.append(
                GenerationRequest(
                    prompt_ids=budget.ids,
                    max_tokens=budget.max_tokens,
                    sampling=sampling,
                    # Choices of one request differ; the same seed repeats the same choices.
                    seed=(base_seed + choice) % 2**64,
                    stop=prompt_stop,
                    logprobs=logprobs,
                    post_sampling_probs=output.post_sampling_probs,
                    prompt_logprobs=output.echo and output.logprobs is not None,
                    skip_special_tokens=output.skip_special_tokens,
                    cache_prompt=body.cache_prompt,
                    num_draft_tokens=body.num_draft_tokens,
                    images=body.images,
                    prompt_text=body.images_prompt,
                    image_tokens=body.image_tokens,
                    # a prompt cut to fit the window: its message ends moved
                    checkpoints=() if budget.truncated or cut else body.checkpoints,
                    report_timings=output.timings and output.stream,
                    report_progress=output.progress and output.stream,
                    healed=healed,
                )
            )
    return plan


def _check_filling(body: Request, loaded, infill: InfillParts | None, settings: Settings) -> None:
    """A fill-in-the-middle request needs a model with FIM tokens, and cannot echo logprobs."""
    if loaded.fim is None:
        field = "input_suffix" if infill is not None else "suffix"
        why = (
            "infill is turned off (--fim-template none)"
            if settings.fim_template == "none"
            else f"its vocabulary has no fill-in-the-middle tokens ({fim_token_names()})"
        )
        raise InvalidRequest(
            f"The model {loaded.model_id} cannot fill in before '{field}': {why}. Serve a code "
            "model with FIM (Qwen2.5-Coder, StarCoder2, CodeLlama, ...), or send no suffix: the "
            "text before the cursor is then continued.",
            param=field,
            code="fim_not_supported",
        )
    if body.output.echo and body.output.logprobs is not None:
        raise InvalidRequest(
            "echo with logprobs cannot be combined with suffix: the model's prompt is the "
            "fill-in-the-middle template, not your text.",
            param="echo",
        )


def _stop_for(loaded, stop: StopSpec, ids: tuple[int, ...], max_tokens: int, filling: bool):
    """One prompt's stop spec: min_tokens within its budget; a FIM prompt's middle also ends
    at the template's own end tokens."""
    prompt_stop = replace(stop, min_tokens=min(stop.min_tokens, max_tokens))
    fim = loaded.fim
    if fim is not None and (filling or _is_fim_prompt(fim, ids)):
        ends = tuple(t for t in fim.stop_ids if t not in prompt_stop.token_ids)
        prompt_stop = replace(prompt_stop, token_ids=prompt_stop.token_ids + ends)
    return prompt_stop


def _deadline(timeout_s: float | None) -> float | None:
    return time.monotonic() + timeout_s if timeout_s else None


def _fill_in_the_middle(
    loaded,
    body: Request,
    prompt: Prompt,
    piece,
    infill: InfillParts | None,
    healing: bool,
) -> tuple[Prompt, bool, str]:
    """The FIM prompt for `suffix` (prompt = the text before the cursor) or /infill, and the
    text token healing took off its prefix (not with a grammar, which says how text starts).
    Echo still returns the user's prompt, not the template."""
    leading = _leading_ids(loaded)
    if infill is None:
        ids = list(prompt.ids)
        if ids[: len(leading)] == leading:
            ids = ids[len(leading) :]
        before = piece if isinstance(piece, str) else ids
        infill = InfillParts(prefix=before, suffix=body.suffix or "")
    try:
        built = build_infill(
            loaded.fim,
            lambda text: _plain_ids(loaded, text),
            infill,
            loaded.context_length,
            body.max_tokens,
            leading,
            (lambda ids: heal(ids, loaded.token_texts)) if healing else None,
        )
    except FimError as error:
        raise InvalidRequest(str(error), param="suffix") from error
    return Prompt(built.ids, prompt.text), built.truncated, built.healed


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


def _kept_head(loaded, ids: tuple[int, ...], keep_first: int | None) -> int:
    """The prompt's tokens that stay in front where it is cut: `keep_first` after its BOS (as
    llama.cpp and Ollama count them), or all (None)."""
    if keep_first is None:
        return len(ids)
    starts_with_bos = loaded.bos_token_id is not None and ids[:1] == (loaded.bos_token_id,)
    return keep_first + starts_with_bos


def _end_of_infill(loaded) -> tuple[int, ...]:
    """What the infill sampler treats as the end of the middle: EOS first, then FIM ends."""
    ends = list(loaded.eos_token_ids)
    if loaded.fim is not None:
        ends += [t for t in loaded.fim.stop_ids if t not in ends]
    return tuple(ends)


def _check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = first_out_of_vocabulary(ids, vocab_size)
    if bad is not None:
        raise InvalidRequest(
            f"token id {bad} in '{param}' is outside the vocabulary [0, {vocab_size}).",
            param=param,
        )


def sampling_for(
    body: Request, tokenizer: Any, infill_end_ids: tuple[int, ...], grammar: str | None
) -> SamplingParams:
    """The request's sampler settings on the loaded model: its tokenizer gives logit_bias's
    ids and DRY's breakers; `infill_end_ids` end the middle for the "infill" sampler;
    `grammar` is the compiled constraint."""
    sampling = body.sampling
    dry = sampling.dry
    return replace(
        sampling,
        logit_bias=token_bias(body.logit_bias, tokenizer),
        dry_breakers=resolve_breakers(tokenizer, dry.breakers) if dry else None,
        infill_end_ids=infill_end_ids if "infill" in sampling.samplers else (),
        grammar=grammar,
    )


def token_bias(bias: LogitBias | None, tokenizer: Any) -> dict[int, float]:
    """logit_bias by token id, in OpenAI's form ({"id": bias}) or llama.cpp's (text keys,
    [[id or text, bias]] pairs, `false` for never): a text biases each of its tokens; biases
    of one token add up."""
    bias = bias or {}
    biased: dict[int, float] = {}
    for key, value in bias.items() if isinstance(bias, dict) else bias:
        if isinstance(key, str) and key.lstrip("-").isdigit() and isinstance(bias, dict):
            ids = [int(key)]
        elif isinstance(key, int):
            ids = [key]
        else:
            ids = tokenizer.encode(key, add_special_tokens=False)
            if not ids:
                raise InvalidRequest(f"logit_bias text {key!r} has no tokens", param="logit_bias")
        for token in ids:
            biased[token] = biased.get(token, 0.0) + (-math.inf if value is False else value)
    return biased
