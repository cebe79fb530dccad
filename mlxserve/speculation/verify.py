"""Drafts checked against the target model's verify pass, for a whole batch in a few device ops:
how many of each row's drafted tokens it keeps, and the token that follows them.

Greedy rows keep drafts while they equal the target's argmax. Sampled rows use speculative
sampling with a point-mass draft (prompt lookup proposes one token, with certainty): drafted
token d at a position is kept with probability p(d) under the target's distribution there; at
the first one refused, the next token is drawn from p with d taken out (the normalised residual
max(0, p - q)); when every draft is kept, from p after the last. The tokens emitted are then
distributed exactly as the target samples them alone (Leviathan et al., 2023).
"""

from __future__ import annotations

import mlx.core as mx

NO_DRAFT = -1  # pads a row's drafts to the batch's longest


def kept_count(matches: mx.array) -> mx.array:
    """(B, K) booleans -> (B,): how many lead before the first False."""
    return mx.cumprod(matches.astype(mx.int32), axis=1).sum(axis=1)


def verify_greedy(logits: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """`logits` (B, K+1, V) of a pass over each row's last token and its K drafts (`drafts`,
    (B, K), padded with NO_DRAFT). Returns (kept (B,), tokens (B, K+1)): a row emits
    tokens[:kept + 1], its kept drafts and the argmax after them."""
    chosen = mx.argmax(logits, axis=-1)
    return kept_count(chosen[:, :-1] == drafts), chosen


def verify_sampled(
    logprobs: mx.array, drafts: mx.array, key: mx.array | None = None
) -> tuple[mx.array, mx.array]:
    """`logprobs` (B, K+1, V): the target's normalised log-probabilities at each position (after
    its logits processors and temperature). Returns (kept (B,), next (B,)): a row emits its
    first `kept` drafts, then `next`."""
    keys = mx.random.split(key, 2) if key is not None else (None, None)
    batch, width = drafts.shape
    rows = mx.arange(batch)
    safe = mx.maximum(drafts, 0)
    drafted_p = mx.exp(mx.take_along_axis(logprobs[:, :width], safe[..., None], axis=-1)[..., 0])
    uniform = mx.random.uniform(shape=(batch, width), key=keys[0])
    kept = kept_count((uniform < drafted_p) & (drafts != NO_DRAFT))
    at = logprobs[rows, kept]  # (B, V): the distribution after the kept drafts
    refused = mx.where(kept < width, drafts[rows, mx.minimum(kept, width - 1)], NO_DRAFT)
    vocabulary = mx.arange(at.shape[-1])
    at = mx.where(vocabulary[None] == refused[:, None], -mx.inf, at)  # the residual
    return kept, mx.random.categorical(at, key=keys[1])
