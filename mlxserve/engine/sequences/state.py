"""One sequence's state on the engine thread: what it needs to start, and each token -> an event.

Kept apart from the batch so it can be tested with a tokenizer and hand-made responses, no model:
`SequenceState.advance` is the whole of "token in, text and finish reason out".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx

from ...sampling.chain import SequenceSampler, make_processors
from ...sampling.grammar_mask import GrammarMask
from ...sampling.healing_mask import HealingMask
from ...sampling.logprobs import LogprobReader, LogprobRow
from ...text import IncrementalDetokenizer, LineRules, StopMatcher
from ..failures.row_guard import RowGuard
from ..models.host import LoadedModel
from ..requests import GenerationEvent, GenerationRequest, PromptProgress, Timings, TokenLogprob


class TokenResponse(Protocol):
    """What the batch reports for one sequence each step (mlx-lm's `GenerationBatch.Response`)."""

    token: int
    finish_reason: str | None


@dataclass
class SequenceState:
    """The engine thread's state for one live sequence."""

    index: int  # its place in the submitted group
    request: GenerationRequest
    post: Callable[[GenerationEvent], None]
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    lines: LineRules
    logprob_reader: LogprobReader | None
    sampler: SequenceSampler | None = None  # kept to read its final logits (post_sampling_probs)
    prefill_only: bool = False  # max_tokens 0: prefilled for the prefix cache, nothing generated
    uid: int | None = None  # its row in the batch, once inserted
    slot: int = -1  # llama.cpp's slot number, given when it joins the live sequences
    generated: int = 0
    cumulative_logprob: float = 0.0
    cached_tokens: int = 0
    drafted: int = 0  # tokens drafted for it and verified (speculative decoding)
    accepted: int = 0  # of them, kept
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    unsent: int = 0  # characters of the healed text still to drop from the generated text
    guard: RowGuard | None = None  # its sampler's and processors' failures (failures/row_guard.py)
    # A prompt with images: its tokens as the prefix cache knows them (vision/tower.Prepared.key)
    prefix_key: list[int] | None = None

    def keyed(self, tokens: list[int]) -> list[int]:
        """The row's tokens as the prefix cache keeps them: a prompt with images under its key
        (the images' digests in place of their tokens), then what was generated."""
        if self.prefix_key is None:
            return tokens
        return [*self.prefix_key, *tokens[len(self.prefix_key) :]]

    @classmethod
    def start(
        cls,
        index: int,
        request: GenerationRequest,
        post: Callable[[GenerationEvent], None],
        tokenizer,
    ) -> SequenceState:
        reader = (
            LogprobReader(tokenizer, request.logprobs) if request.logprobs is not None else None
        )
        return cls(
            index=index,
            request=request,
            post=post,
            detokenizer=IncrementalDetokenizer(
                tokenizer, list(request.prompt_ids), skip_special_tokens=request.skip_special_tokens
            ),
            stops=StopMatcher(request.stop.strings, request.stop.include_in_output),
            lines=LineRules(request.stop.min_indent),
            logprob_reader=reader,
            unsent=len(request.healed),
        )

    def timings(self) -> Timings:
        now = time.monotonic()
        first = self.first_token_at if self.first_token_at is not None else now
        return Timings(
            prompt_tokens=len(self.request.prompt_ids) - self.cached_tokens,
            cached_tokens=self.cached_tokens,
            prompt_ms=(first - self.started) * 1000,
            generated_tokens=self.generated,
            decode_ms=(now - first) * 1000,
            draft_tokens=self.drafted,
            draft_accepted=self.accepted,
        )

    def advance(self, response: TokenResponse, row: LogprobRow | None) -> GenerationEvent:
        """Feed one generated token (and its logprob row, if asked for); the event to post.
        `event.finish_reason` is set when the sequence ends."""
        request = self.request
        self.generated += 1
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        finish = response.finish_reason
        if self.prefill_only:
            self.generated = 0
            finish = "length"
        event = GenerationEvent(index=self.index, completion_tokens=self.generated, slot=self.slot)
        if finish == "stop":
            # A stop token (EOS or stop_token_ids) ends the text without adding to it.
            event.text = self.stops.flush() + self.detokenizer.flush()
        elif not self.prefill_only:
            event.token_ids.append(response.token)
            delta = self.detokenizer.add(response.token)
            if finish == "length":
                delta += self.detokenizer.flush()
            if self.unsent:  # the client has the healed text already
                cut = min(self.unsent, len(delta))
                delta, self.unsent = delta[cut:], self.unsent - cut
            result = self.stops.feed(delta, active=self.generated >= request.stop.min_tokens)
            lines = self.lines.feed(result.text)
            event.text = lines.text
            if result.stopped:
                finish, event.stopping_word = "stop", result.matched
            elif lines.stopped or self.out_of_time():
                finish = "length"  # llama.cpp's limit stops
            if finish == "length" and not lines.stopped:
                event.text += self.stops.flush()
            if row is not None:
                self.cumulative_logprob += row.logprob
                event.tokens.append(describe(self.logprob_reader, self.detokenizer.ids, row, delta))
        event.cumulative_logprob = self.cumulative_logprob
        event.finish_reason = finish
        if finish is not None:
            event.cached_tokens = self.cached_tokens
        if finish is not None or request.report_timings:
            event.timings = self.timings()
        return event

    def progress(self, read: int, total: int) -> GenerationEvent:
        """An event saying `read` of the `total` prompt tokens the batch was given are read (the
        tokens past the prefix cache's)."""
        whole = len(self.request.prompt_ids)
        cached = max(0, whole - total) if total else self.cached_tokens
        progress = PromptProgress(
            total=whole,
            cache=cached,
            processed=min(whole, cached + read),
            time_ms=(time.monotonic() - self.started) * 1000,
        )
        return GenerationEvent(index=self.index, slot=self.slot, prompt_progress=progress)

    def out_of_time(self) -> bool:
        """The server's deadline passed, or llama.cpp's t_max_predict_ms after a line break."""
        deadline = self.request.stop.deadline
        if deadline is not None and time.monotonic() > deadline:
            return True
        limit = self.request.stop.max_predict_ms
        if not limit or not self.lines.seen_newline or self.first_token_at is None:
            return False
        return (time.monotonic() - self.first_token_at) * 1000 > limit


@dataclass
class SamplingSetup:
    """What a sequence is inserted into the batch with."""

    sampler: SequenceSampler
    processors: list  # each guarded by `guard`
    stop_ids: list[int]
    guard: RowGuard
    guarded_sampler: Callable


def sampling_setup(request: GenerationRequest, loaded: LoadedModel) -> SamplingSetup:
    """The sequence's sampler, logits processors and stop tokens.

    With a grammar, the grammar says where the text ends: EOS always stops, and neither
    ignore_eos nor min_tokens may ban it (the grammar may allow nothing else).
    """
    stop, grammar = request.stop, request.sampling.grammar
    prompt_length = len(request.prompt_ids)
    ignore_eos = stop.ignore_eos and grammar is None
    eos = [] if ignore_eos else list(loaded.eos_token_ids)
    stop_ids = eos + [t for t in stop.token_ids if t not in eos]
    mask = None
    if grammar is not None:
        mask = GrammarMask(
            loaded.grammars.matcher(grammar),
            prompt_length,
            loaded.grammars.vocab_size,
            list(loaded.eos_token_ids),
        )
    processors = make_processors(
        request.sampling,
        loaded.vocab_size,
        loaded.context_length,
        banned_until=(stop_ids if grammar is None else (), prompt_length, stop.min_tokens),
        always_banned=loaded.eos_token_ids if ignore_eos else (),
        grammar_mask=mask,
    )
    if request.healed:
        processors.append(HealingMask(request.healed, loaded.token_texts, prompt_length))
    sampler = SequenceSampler(
        request.sampling,
        loaded.vocab_size,
        request.seed,
        keep_final=request.post_sampling_probs and request.logprobs is not None,
        reports_logprobs=request.logprobs is not None,
    )
    guard = RowGuard()
    guarded = [
        guard.processor(p, "grammar" if p is mask else "logits processor") for p in processors
    ]
    return SamplingSetup(sampler, guarded, stop_ids, guard, guard.sampler(sampler))


def read_logprob_rows(live: list[tuple]) -> dict[int, LogprobRow]:
    """The logprob rows of this step's (response, SequenceState) pairs that asked for them, by
    id of the state: one device round trip for all."""
    scored = [(r, s) for r, s in live if s.logprob_reader is not None]
    if not scored:
        return {}
    rows = LogprobReader.read_rows(
        mx.concatenate([scored_logprobs(r, s) for r, s in scored]),
        [r.token for r, _ in scored],
        max(s.request.logprobs for _, s in scored),
    )
    return {id(s): row for (_, s), row in zip(scored, rows)}


def scored_logprobs(response, seq: SequenceState) -> mx.array:
    """[1, V]: the model's logprobs (after the logits processors), or with post_sampling_probs
    those of the distribution the sampler drew from."""
    sampler = seq.sampler
    if sampler is not None and sampler.finals:
        final = sampler.finals.popleft().astype(mx.float32)
        return final - mx.logsumexp(final, axis=-1, keepdims=True)
    return response.logprobs.reshape(1, -1)


def describe(reader: LogprobReader, ids_with_token, row: LogprobRow, text: str) -> TokenLogprob:
    """A token's logprob entry with its top alternatives rendered as text."""
    alternatives = reader.alternatives(ids_with_token, row)
    top = reader.by_text(alternatives, text, row.logprob)
    return TokenLogprob(row.token_id, text, row.logprob, top, alternatives)
