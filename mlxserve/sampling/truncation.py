"""llama.cpp's truncation samplers beyond mlx-lm's top-k / top-p / min-p, as vectorised mx ops.

Each takes and returns `[1, V]` logits (log-probabilities are logits too: every step here is
shift-invariant) with removed tokens at -inf. Sources: llama.cpp src/llama-sampling.cpp
(REFERENCE §1); the comments name the quantities as llama.cpp does.
"""

from __future__ import annotations

import mlx.core as mx

NEG_INF = -float("inf")


def _probs(logits: mx.array) -> mx.array:
    return mx.softmax(logits.astype(mx.float32), axis=-1)


def apply_typical_p(logits: mx.array, typical_p: float) -> mx.array:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy, until
    their mass first exceeds `typical_p` (the token crossing it is kept)."""
    p = _probs(logits)
    log_p = mx.log(p)
    entropy = -mx.sum(mx.where(p > 0, p * log_p, 0.0), axis=-1, keepdims=True)
    shifted = mx.where(p > 0, mx.abs(-log_p - entropy), mx.inf)
    order = mx.argsort(shifted, axis=-1)
    sorted_p = mx.take_along_axis(p, order, axis=-1)
    mass_before = mx.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = (mass_before <= typical_p) & (sorted_p > 0)
    keep = mx.put_along_axis(mx.zeros(p.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)
    return mx.where(keep, logits, NEG_INF)


def apply_top_n_sigma(logits: mx.array, n: float) -> mx.array:
    """Keep tokens whose logit is within n standard deviations of the largest (finite) logit."""
    finite = logits > NEG_INF
    count = mx.maximum(mx.sum(finite, axis=-1, keepdims=True), 1)
    values = mx.where(finite, logits, 0.0)
    mean = mx.sum(values, axis=-1, keepdims=True) / count
    variance = mx.sum(mx.where(finite, (logits - mean) ** 2, 0.0), axis=-1, keepdims=True) / count
    top = mx.max(logits, axis=-1, keepdims=True)
    return mx.where(logits >= top - n * mx.sqrt(variance), logits, NEG_INF)


def apply_xtc(logits: mx.array, probability: float, threshold: float, key: mx.array) -> mx.array:
    """Exclude Top Choices: with `probability`, drop every token at or above `threshold` except
    the least likely of them (only when at least two reach it)."""
    p = _probs(logits)
    above = p >= threshold
    least_above = mx.min(mx.where(above, p, mx.inf), axis=-1, keepdims=True)
    drop = above & (p > least_above) & (mx.sum(above, axis=-1, keepdims=True) >= 2)
    fires = mx.random.uniform(shape=(), key=key) < probability
    return mx.where(drop & fires, NEG_INF, logits)


def dynamic_temperature(
    logits: mx.array, temperature: float, spread: float, exponent: float
) -> mx.array:
    """Entropy-scaled temperature in [temperature - spread, temperature + spread]: confident
    distributions are sampled cooler, flat ones hotter. Returns the logits divided by it."""
    low, high = max(0.0, temperature - spread), temperature + spread
    p = _probs(logits)
    candidates = mx.sum(p > 0, axis=-1, keepdims=True)
    entropy = -mx.sum(mx.where(p > 0, p * mx.log(p), 0.0), axis=-1, keepdims=True)
    max_entropy = mx.log(mx.maximum(candidates, 2).astype(mx.float32))
    normalized = mx.clip(entropy / max_entropy, 0.0, 1.0)
    dyn_temp = low + (high - low) * normalized**exponent
    return logits / mx.maximum(dyn_temp, 1e-6)


def apply_infill(logits: mx.array, end_of_text: mx.array, fallback: int) -> mx.array:
    """llama.cpp's infill sampler, for editors' fill-in-the-middle: end the middle when ending
    is comparatively likely, else keep only confident text tokens.

    `end_of_text` is a `[V]` bool mask of the tokens that end a middle (EOS, FIM end tokens).
    If 3 x P(end) x candidates > P(text), only the end tokens stay. Otherwise text tokens under
    p 0.2 go, then (renormalised) those under 1 / (text tokens left + 1); with no text token left,
    only `fallback` (the model's end of text) stays. llama.cpp also merges tokens that are
    prefixes of each other before the thresholds; that needs token strings and is left out.
    """
    p = _probs(logits)
    finite = logits > NEG_INF
    candidates = mx.sum(finite, axis=-1, keepdims=True)
    p_end = mx.sum(mx.where(end_of_text, p, 0.0), axis=-1, keepdims=True)
    p_text = mx.sum(mx.where(end_of_text, 0.0, p), axis=-1, keepdims=True)
    only_end = 3 * p_end * candidates > p_text
    text = finite & ~end_of_text
    kept = (finite & end_of_text) | (text & (p >= 0.2))
    kept_text = mx.sum(kept & text, axis=-1, keepdims=True)
    renormalised = p / mx.maximum(mx.sum(mx.where(kept, p, 0.0), axis=-1, keepdims=True), 1e-30)
    kept = (finite & end_of_text) | (kept & text & (renormalised >= 1.0 / (kept_text + 1)))
    end_only = mx.arange(logits.shape[-1]) == fallback
    keep = mx.where(only_end, finite & end_of_text, mx.where(kept_text == 0, end_only, kept))
    return mx.where(keep, mx.where(end_only & ~finite, 0.0, logits), NEG_INF)
