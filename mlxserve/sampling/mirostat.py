"""Mirostat v1 and v2 (llama.cpp src/llama-sampling.cpp; REFERENCE §1): sampling that steers the
observed surprise toward a target `tau` by adapting a truncation threshold `mu` with rate `eta`.

`mu` lives on the device as a scalar mx.array updated lazily each step, so a mirostat sequence
needs no host round trip beyond the token itself. Mirostat replaces truncation and the draw.
"""

from __future__ import annotations

import mlx.core as mx

NEG_INF = -float("inf")
V1_M = 100  # tokens used to estimate the Zipf exponent s_hat (llama.cpp's m)


class Mirostat:
    def __init__(self, version: int, tau: float, eta: float, vocab_size: int):
        if version not in (1, 2):
            raise ValueError(f"mirostat version must be 1 or 2, got {version}")
        self.version = version
        self.tau, self.eta, self.vocab_size = tau, eta, vocab_size
        self.mu = mx.array(2.0 * tau)  # llama.cpp starts mu at 2 * tau
        # t_i = ln((i + 2) / (i + 1)) for i < m - 1, the regressor of the Zipf fit
        index = mx.arange(V1_M - 1, dtype=mx.float32)
        self._t = mx.log((index + 2) / (index + 1))

    def sample(self, logits: mx.array, key: mx.array) -> mx.array:
        """Draw a token from `[1, V]` logits (temperature already applied); update mu."""
        if self.version == 2:
            # No sort needed: in descending order surprise only grows, so "cut at the first token
            # whose surprise exceeds mu" keeps exactly the tokens at or under mu (at least one).
            keep = self._truncate_v2(mx.softmax(logits.astype(mx.float32), axis=-1))
            return self._draw(logits, keep, key)
        order = mx.argsort(-logits, axis=-1)
        sorted_logits = mx.take_along_axis(logits, order, axis=-1)
        sorted_p = mx.softmax(sorted_logits.astype(mx.float32), axis=-1)
        choice = self._draw(sorted_logits, self._truncate_v1(sorted_p), key)
        return mx.take_along_axis(order, choice[:, None], axis=-1)[:, 0]

    def _draw(self, logits: mx.array, keep: mx.array, key: mx.array) -> mx.array:
        """Sample among the kept tokens, then move mu by the observed surprise's error."""
        kept_logits = mx.where(keep, logits, NEG_INF)
        choice = mx.random.categorical(kept_logits, key=key)
        kept_p = mx.softmax(kept_logits.astype(mx.float32), axis=-1)
        p_choice = mx.take_along_axis(kept_p, choice[:, None], axis=-1)[0, 0]
        surprise = -mx.log2(p_choice)
        self.mu = self.mu - self.eta * (surprise - self.tau)
        return choice

    def _truncate_v2(self, p: mx.array) -> mx.array:
        """Keep tokens whose surprise -log2(p) is at most mu, and always the most likely one."""
        keep = -mx.log2(p) <= self.mu
        top = mx.arange(p.shape[-1]) == mx.argmax(p, axis=-1, keepdims=True)
        return keep | top

    def _truncate_v1(self, sorted_p: mx.array) -> mx.array:
        """Keep the top k, k from a Zipf fit of the m most likely tokens and the target mu."""
        k = self.v1_k(sorted_p)
        rank = mx.arange(sorted_p.shape[-1])
        return rank < mx.maximum(mx.floor(k), 1)

    def v1_k(self, sorted_p: mx.array) -> mx.array:
        m = min(V1_M, sorted_p.shape[-1])
        head = sorted_p[0, :m]
        t = self._t[: m - 1]
        valid = (head[1:] > 0) & (head[:-1] > 0)
        b = mx.where(valid, mx.log(mx.where(valid, head[:-1] / head[1:], 1.0)), 0.0)
        s_hat = mx.sum(t * b) / mx.sum(mx.where(valid, t * t, 0.0))
        epsilon = s_hat - 1
        n = float(self.vocab_size)
        return ((epsilon * mx.power(2.0, self.mu)) / (1 - mx.power(n, -epsilon))) ** (1 / s_hat)
