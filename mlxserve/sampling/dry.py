"""DRY ("don't repeat yourself") with llama.cpp's semantics (src/llama-sampling.cpp; REFERENCE §1).

A logits processor over the last N tokens of the context (prompt included), computed entirely on
the device: for every earlier position j, the length of the longest run ending at j that equals
the run ending at the newest token (capped at the tokens since the last sequence breaker); the
token that followed j is penalised by multiplier * base ** (length - allowed_length).
Cost per step: O(N x K) element-wise ops, K = min(N, MAX_MATCH), no host round trip.
"""

from __future__ import annotations

import math

import mlx.core as mx

from .breakers import Breakers
from .params import DryParams

# Match lengths are computed up to this many tokens. Longer runs are penalised as this long:
# with base >= 1.1 that is already over 1e5 in logits, i.e. a ban.
MAX_MATCH = 128
FLOAT_MAX_LOG = 88.7228391  # llama.cpp clamps the exponent so base ** exponent stays finite


class DryPenalty:
    """`(tokens, logits) -> logits` for one sequence."""

    def __init__(self, params: DryParams, breakers: Breakers, vocab_size: int, context: int):
        self.params = params
        self.window = context if params.penalty_last_n < 0 else params.penalty_last_n
        self.vocab_size = vocab_size
        single = mx.zeros((vocab_size,), dtype=mx.bool_)
        if breakers.single:
            single[mx.array(sorted(breakers.single))] = True
        self.single = single
        self.multi = []
        for tail, heads in breakers.multi:
            head_mask = mx.zeros((vocab_size,), dtype=mx.bool_)
            head_mask[mx.array(sorted(heads))] = True
            self.multi.append((mx.array(list(tail)), head_mask))
        self.max_exponent = (
            int(FLOAT_MAX_LOG / math.log(params.base)) if params.base > 1.000001 else 0
        )

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        history = tokens[-self.window :] if self.window < tokens.size else tokens
        length = history.size
        if length <= self.params.allowed_length:
            return logits
        penalty = self.penalties(history)
        return logits - penalty.astype(logits.dtype)[None, : logits.shape[-1]]

    def rep_limit(self, history: mx.array) -> mx.array:
        """Tokens after the most recent sequence breaker (all of them when there is none).

        As llama.cpp: take the newest position where a breaker's head sits with its tail after it;
        the limit is the tokens after that head, less the longest tail matched there.
        """
        length = history.size
        matches = [(self.single[history], 0)]  # (head positions that match, tail length)
        for tail, head_mask in self.multi:
            span = tail.size
            if span >= length:
                continue
            starts = mx.arange(length - span)
            follows = mx.stack([history[starts + 1 + k] == tail[k] for k in range(span)], axis=1)
            match = head_mask[history[: length - span]] & mx.all(follows, axis=1)
            matches.append((mx.concatenate([match, mx.zeros((span,), dtype=mx.bool_)]), span))
        position = mx.arange(length)
        anywhere = matches[0][0]
        for match, _ in matches[1:]:
            anywhere = anywhere | match
        newest = mx.max(mx.where(anywhere, position, -1))
        at = mx.maximum(newest, 0)
        longest = mx.max(mx.stack([mx.where(match[at], span, -1) for match, span in matches]))
        return mx.where(newest >= 0, length - 1 - newest - longest, length)

    def match_lengths(self, history: mx.array) -> mx.array:
        """For j in 0..L-2: the longest run ending at j equal to the run ending at the newest."""
        length = history.size
        k = min(length - 1, MAX_MATCH)
        newest_backwards = history[::-1][:k]  # s[i] = h[L-1-i]
        j = mx.arange(length - 1)[:, None]
        i = mx.arange(k)[None, :]
        index = j - i
        same = (history[mx.maximum(index, 0)] == newest_backwards[None, :]) & (index >= 0)
        return mx.cumprod(same.astype(mx.int32), axis=1).sum(axis=1)

    def penalties(self, history: mx.array) -> mx.array:
        p = self.params
        lengths = mx.minimum(self.match_lengths(history), self.rep_limit(history))
        candidates = history[1:]
        exponent = mx.maximum(lengths - p.allowed_length, 0)
        if self.max_exponent:
            exponent = mx.minimum(exponent, self.max_exponent)
        amount = p.multiplier * mx.power(p.base, exponent.astype(mx.float32))
        amount = mx.where((lengths >= p.allowed_length) & ~self.single[candidates], amount, 0.0)
        return mx.zeros((self.vocab_size,), dtype=mx.float32).at[candidates].maximum(amount)
