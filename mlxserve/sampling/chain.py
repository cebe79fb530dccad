"""The sampler chain for one sequence, built from mlx-lm's pieces plus a per-sequence RNG key.

Order follows llama.cpp (REFERENCE §1): logit_bias -> penalties -> top_k -> top_p -> min_p ->
temperature -> draw. Bias and penalties are logits processors (mlx-lm runs them before it
normalises to logprobs); the truncations and the draw are the sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from .params import SamplingParams

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

BANNED = -float("inf")


class SequenceSampler:
    """Draws one token from `[1, V]` logprobs with this sequence's own key.

    The key is split once per draw, so a seeded sequence gives the same tokens alone or in a batch.
    """

    def __init__(self, params: SamplingParams, vocab_size: int, seed: int):
        self.params = params
        self.key = mx.random.key(seed % 2**64)
        self.top_k = params.top_k if 0 < params.top_k < vocab_size else 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        p = self.params
        if p.greedy:
            return mx.argmax(logprobs, axis=-1)
        if self.top_k:
            logprobs = apply_top_k(logprobs, self.top_k)
        if 0.0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        self.key, draw_key = mx.random.split(self.key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=draw_key)


def make_processors(
    params: SamplingParams,
    vocab_size: int,
    context_length: int,
    banned_until: tuple[Sequence[int], int, int] | None = None,
    always_banned: Sequence[int] = (),
) -> list[LogitsProcessor]:
    """Logits processors for one sequence.

    `banned_until = (ids, prompt_len, min_tokens)` bans `ids` until `min_tokens` tokens were
    generated (EOS and stop ids under min_tokens); `always_banned` bans ids for good (EOS
    under ignore_eos).
    """
    processors: list[LogitsProcessor] = []
    if params.allowed_token_ids is not None:
        processors.append(_allow_only(params.allowed_token_ids, vocab_size))
    window = context_length if params.repeat_last_n < 0 else params.repeat_last_n
    penalties = window > 0
    processors += make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty
        if penalties and params.repetition_penalty != 1.0
        else None,
        repetition_context_size=window,
        presence_penalty=params.presence_penalty if penalties else None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty if penalties else None,
        frequency_context_size=window,
    )
    if always_banned:
        processors.append(_ban(list(always_banned)))
    if banned_until is not None:
        ids, prompt_len, min_tokens = banned_until
        if ids and min_tokens > 0:
            processors.append(_ban_while_short(list(ids), prompt_len + min_tokens))
    return processors


def _allow_only(allowed: Sequence[int], vocab_size: int) -> LogitsProcessor:
    mask = mx.full((vocab_size,), BANNED)
    mask[mx.array(list(allowed))] = 0.0

    def allow_only(_tokens: mx.array, logits: mx.array) -> mx.array:
        return logits + mask[: logits.shape[-1]]

    return allow_only


def _ban(ids: list[int]) -> LogitsProcessor:
    index = mx.array(ids)

    def ban(_tokens: mx.array, logits: mx.array) -> mx.array:
        logits[:, index] = BANNED
        return logits

    return ban


def _ban_while_short(ids: list[int], min_length: int) -> LogitsProcessor:
    """Ban ids while the context (prompt + generated) is shorter than `min_length` tokens."""
    ban = _ban(ids)

    def ban_while_short(tokens: mx.array, logits: mx.array) -> mx.array:
        # mlx-lm calls processors one step ahead: the context holds the tokens fed so far.
        return ban(tokens, logits) if len(tokens) < min_length else logits

    return ban_while_short
