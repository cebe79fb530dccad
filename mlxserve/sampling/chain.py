"""The sampler chain for one sequence: llama.cpp's order, mlx-lm's pieces, a per-sequence RNG key.

Logits processors run first (mlx-lm calls them before it normalises to logprobs): allowed ids,
logit_bias, penalties, DRY, and the bans for EOS / stop ids. Then the sampler: the truncation
samplers and temperature in `params.samplers` order (llama.cpp's names; a sampler left out of a
client's list does not run), and the draw. Mirostat replaces truncation and draw: logit_bias ->
penalties -> DRY -> temperature -> mirostat, with top_k / top_p / min_p / typical / XTC /
top_n_sigma ignored, as in llama.cpp.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    make_logits_processors,
)

from ..speculation.verify import verify_sampled
from .dry import DryPenalty
from .mirostat import Mirostat
from .params import SamplingParams
from .truncation import (
    apply_infill,
    apply_top_n_sigma,
    apply_typical_p,
    apply_xtc,
    dynamic_temperature,
)

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
Step = Callable[[mx.array], mx.array]

BANNED = -float("inf")


class SequenceSampler:
    """Draws one token from `[1, V]` logprobs with this sequence's own key.

    The key is split once per draw, so a seeded sequence gives the same tokens alone or in a batch.
    With `keep_final`, `finals` queues the logits of each draw after the chain (removed tokens at
    -inf; greedy: only the chosen one), for llama.cpp's post_sampling_probs; with mirostat, the
    logits before its own truncation. The batch draws a token a step before it reports it, so
    the reader takes them first in, first out.
    """

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        seed: int,
        keep_final: bool = False,
        reports_logprobs: bool = False,
    ):
        self.params = params
        self.keep_final = keep_final
        # A greedy row that reports no logprobs takes the argmax of its logits as they are: a
        # step whose rows are all such skips normalising them (decode_step.py).
        self.needs_logprobs = reports_logprobs or not params.greedy
        self.finals: collections.deque[mx.array] = collections.deque()
        self.key = mx.random.key(seed % 2**64)
        sampling = not params.greedy
        self.mirostat = (
            Mirostat(params.mirostat, params.mirostat_tau, params.mirostat_eta, vocab_size)
            if params.mirostat and sampling
            else None
        )
        self.steps = self._steps(params, vocab_size) if sampling and not self.mirostat else []
        # Only XTC draws randomness inside the chain; everyone else keeps one split per token.
        self.chain_needs_key = sampling and params.xtc_probability > 0 and "xtc" in params.samplers
        # Rows with equal keys draw in one graph (`draw_rows`); mirostat's state and XTC's
        # randomness inside the chain are the row's own.
        alone = self.mirostat is not None or self.chain_needs_key
        self.group_key = None if alone else _chain_signature(params, vocab_size)

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.group_key is not None:
            return self.draw_rows([self], logprobs)
        p = self.params
        self.key, key = mx.random.split(self.key)
        if self.mirostat is not None:
            scaled = logprobs * (1.0 / p.temperature)
            if self.keep_final:
                self.finals.append(scaled)
            return self.mirostat.sample(scaled, key)
        draw_key, step_key = mx.random.split(key) if self.chain_needs_key else (key, None)
        for step in self.steps:
            logprobs = step(logprobs, step_key)
        if self.keep_final:
            self.finals.append(logprobs)
        return mx.random.categorical(logprobs, key=draw_key)

    @property
    def verifies_drafts(self) -> bool:
        """Whether its draws can be replaced by speculative sampling over a verify pass: a chain
        without randomness of its own (XTC) or state (mirostat), recording no finals."""
        return self.mirostat is None and not self.chain_needs_key and not self.keep_final

    def drafts_verified(self, logprobs: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
        """Speculative sampling over one row's verify pass: `logprobs` (K+1, V) at its token
        and each of its K `drafts` (after the logits processors). The chain runs at every
        position; returns (kept (1,), next (1,)) as `speculation.verify.verify_sampled`."""
        self.key, key = mx.random.split(self.key)
        if not self.params.greedy:
            for step in self.steps:
                logprobs = step(logprobs, None)
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        return verify_sampled(logprobs[None], drafts[None], key)

    @staticmethod
    def draw_rows(members: Sequence[SequenceSampler], logprobs: mx.array) -> mx.array:
        """One token for each row of `logprobs` (`[n, V]`), row i drawn by `members[i]`, which
        share a `group_key`: the chain runs once on all rows, and each row draws with its own
        key, so a row's token is the same whichever rows it is drawn beside."""
        first = members[0]
        if first.params.greedy:
            tokens = mx.argmax(logprobs, axis=-1)
            if any(m.keep_final for m in members):
                chosen = mx.arange(logprobs.shape[-1]) == tokens[:, None]
                logprobs = mx.where(chosen, 0.0, BANNED)
            new_keys = None
        else:
            keys = mx.stack([m.key for m in members])
            for step in first.steps:
                logprobs = step(logprobs, None)
            split = _split_keys(keys)
            tokens = _draw(logprobs, split[:, 1])
            new_keys = split[:, 0]
        for i, member in enumerate(members):  # only once the whole draw is built
            if new_keys is not None:
                member.key = new_keys[i]
            if member.keep_final:
                member.finals.append(logprobs[i : i + 1])
        return tokens

    @staticmethod
    def _steps(
        p: SamplingParams, vocab_size: int
    ) -> list[Callable[[mx.array, mx.array], mx.array]]:
        """The configured truncation steps, in order; each takes (logits, key)."""
        top_k = p.top_k if 0 < p.top_k < vocab_size else 0
        available = {
            "top_n_sigma": (p.top_n_sigma > 0, lambda x, _: apply_top_n_sigma(x, p.top_n_sigma)),
            "top_k": (bool(top_k), lambda x, _: apply_top_k(x, top_k)),
            "typ_p": (p.typical_p < 1.0, lambda x, _: apply_typical_p(x, p.typical_p)),
            "top_p": (0.0 < p.top_p < 1.0, lambda x, _: apply_top_p(x, p.top_p)),
            "min_p": (p.min_p > 0.0, lambda x, _: apply_min_p(x, p.min_p)),
            "xtc": (
                p.xtc_probability > 0.0,
                lambda x, k: apply_xtc(x, p.xtc_probability, p.xtc_threshold, k),
            ),
            "temperature": (True, _temperature_step(p)),
            "infill": (bool(p.infill_end_ids), _infill_step(p, vocab_size)),
        }
        return [available[name][1] for name in p.samplers if available.get(name, (False,))[0]]


def _chain_signature(p: SamplingParams, vocab_size: int) -> tuple:
    """What the chain of `SequenceSampler._steps` and the draw depend on: rows with equal
    signatures can run one chain."""
    if p.greedy:
        return ("greedy",)
    return (
        "chain",
        vocab_size,
        p.samplers,
        p.temperature,
        p.top_k,
        p.top_p,
        p.min_p,
        p.typical_p,
        p.top_n_sigma,
        p.dynatemp_range,
        p.dynatemp_exponent,
        p.infill_end_ids,
    )


# Per-row keys over a batch of rows: each row's split and draw are what they would be alone.
_split_keys = mx.vmap(mx.random.split)
_draw = mx.vmap(lambda row, key: mx.random.categorical(row, key=key))


def _infill_step(p: SamplingParams, vocab_size: int) -> Callable[[mx.array, mx.array], mx.array]:
    if not p.infill_end_ids:
        return lambda x, _: x
    ends = mx.array(p.infill_end_ids)
    end_of_text = mx.any(mx.arange(vocab_size)[:, None] == ends[None, :], axis=1)
    return lambda x, _: apply_infill(x, end_of_text, p.infill_end_ids[0])


def _temperature_step(p: SamplingParams) -> Callable[[mx.array, mx.array], mx.array]:
    if p.dynatemp_range > 0:
        return lambda x, _: dynamic_temperature(
            x, p.temperature, p.dynatemp_range, p.dynatemp_exponent
        )
    scale = 1.0 / p.temperature
    return lambda x, _: x * scale


def make_processors(
    params: SamplingParams,
    vocab_size: int,
    context_length: int,
    banned_until: tuple[Sequence[int], int, int] | None = None,
    always_banned: Sequence[int] = (),
    grammar_mask: LogitsProcessor | None = None,
) -> list[LogitsProcessor]:
    """Logits processors for one sequence.

    The grammar mask (sampling/grammar_mask.py) comes after bias, penalties and DRY, so what they
    do can never let a token the grammar forbids back in.

    `banned_until = (ids, prompt_len, min_tokens)` bans `ids` until `min_tokens` tokens were
    generated (EOS and stop ids under min_tokens); `always_banned` bans ids for good (EOS
    under ignore_eos).
    """
    processors: list[LogitsProcessor] = []
    if params.allowed_token_ids is not None:
        processors.append(_allow_only(params.allowed_token_ids, vocab_size))
    window = context_length if params.repeat_last_n < 0 else params.repeat_last_n
    penalties = window > 0 and "penalties" in params.samplers
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
    dry = params.dry
    if (
        dry is not None
        and dry.multiplier > 0
        and dry.penalty_last_n != 0
        and "dry" in params.samplers
    ):
        processors.append(DryPenalty(dry, params.dry_breakers, vocab_size, context_length))
    if grammar_mask is not None:
        processors.append(grammar_mask)
    if always_banned:
        processors.append(Ban(always_banned))
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


class Ban:
    """Bans `ids` for good. Rows that ban the same ids (EOS under ignore_eos) are banned in one
    op by the decode step, which groups them by `banned_ids` and uses the first one's `index`."""

    def __init__(self, ids: Sequence[int]):
        self.banned_ids = tuple(ids)
        self.index = mx.array(list(ids))

    def __call__(self, _tokens: mx.array, logits: mx.array) -> mx.array:
        logits[:, self.index] = BANNED
        return logits


def shared_bans(processors: list) -> tuple[list[tuple[Ban, list[int]]], list[list]]:
    """The bans of fixed ids among each row's `processors` (those that give up their `ban`),
    grouped by ids with the rows that hold each, and each row's other processors. A ban
    commutes with every other processor: each leaves a -inf logit at -inf."""
    bans: dict[tuple[int, ...], tuple[Ban, list[int]]] = {}
    own = []
    for row, row_processors in enumerate(processors):
        kept = []
        for processor in row_processors or ():
            ban = getattr(processor, "ban", None)
            if ban is None:
                kept.append(processor)
            else:
                bans.setdefault(ban.banned_ids, (ban, []))[1].append(row)
        own.append(kept)
    return list(bans.values()), own


def banned_at_rows(logits: mx.array, bans: list[tuple[Ban, list[int]]]) -> mx.array:
    """`logits` (rows first, the vocabulary last: a step's (B, V) or a verify pass's (B, L, V))
    with each of `shared_bans`' bans at its rows, at every position: one op a ban."""
    shape = logits.shape
    logits = logits.reshape(shape[0], -1, shape[-1])
    for ban, rows in bans:
        if len(rows) == shape[0]:
            logits[:, :, ban.index] = BANNED
        else:
            positions = mx.arange(logits.shape[1])[None, :, None]
            logits[mx.array(rows)[:, None, None], positions, ban.index[None, None]] = BANNED
    return logits.reshape(shape)


def _ban_while_short(ids: list[int], min_length: int) -> LogitsProcessor:
    """Ban ids while the context (prompt + generated) is shorter than `min_length` tokens."""
    ban = Ban(ids)

    def ban_while_short(tokens: mx.array, logits: mx.array) -> mx.array:
        # mlx-lm calls processors one step ahead: the context holds the tokens fed so far.
        return ban(tokens, logits) if len(tokens) < min_length else logits

    return ban_while_short
