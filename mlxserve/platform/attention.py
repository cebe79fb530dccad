"""Attention for MLX's CPU backend, where `mx.exp` is the bottleneck of a long context.

MLX's CPU `exp` is a scalar loop, so softmax, not the matmuls, is most of the cost of attending
far into a long prompt. Here exp is a degree-6 polynomial for 2^f times 2^n built from the
exponent bits, all ops MLX vectorises; `mx.compile` fuses them into one loop, to float32's own
precision. The whole part n is a truncating cast, not `mx.floor`, which `mx.compile` leaves out
of the fused loop on the CPU. `scripts/cpu_training_ops.py` trains with it. Grouped-query heads
share their key/value heads by reshaping the queries, never by copying keys.

That fused loop is still slower than numpy's exp, so a prompt chunk's softmax, which has scores
enough to pay for waiting on them in every layer, runs in numpy instead (`NUMPY_MIN_SCORES`).

A GPU keeps `mx.fast.scaled_dot_product_attention`, a fused kernel; so do quantized KV caches and
attention sinks here.
"""

from __future__ import annotations

import logging
import math
import sys

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

LOG2_E = 1 / math.log(2)
MIN_EXPONENT = -126.0  # 2^-126: float32's smallest normal; lower scores round to nearly 0


def _two_to_the_fraction_coefficients() -> list[float]:
    """Least-squares polynomial for 2^f on (-1, 0], lowest power first (max error ~2e-7)."""
    f = np.linspace(-1.0, 0.0, 10_001)
    return [float(c) for c in np.polyfit(f, 2.0**f, 6)[::-1]]


COEFFICIENTS = _two_to_the_fraction_coefficients()


def _exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(x) for x <= 0 as 2^f (a polynomial) and the bits of the float32 2^n."""
    y = mx.maximum(x * LOG2_E, MIN_EXPONENT)
    whole = y.astype(mx.int32)  # y <= 0, so this rounds up and the fraction is in (-1, 0]
    fraction = y - whole
    power = COEFFICIENTS[-1]
    for c in COEFFICIENTS[-2::-1]:
        power = power * fraction + c
    return power, mx.left_shift(whole + 127, 23)


def _shifted(scores: mx.array) -> mx.array:
    return scores - scores.max(axis=-1, keepdims=True)


def _normalised(power: mx.array, two_to_whole: mx.array) -> mx.array:
    weights = power * two_to_whole
    return weights / weights.sum(axis=-1, keepdims=True)


# Shapeless, since the key count grows every decode step and each retrace costs. The float32
# view of the exponent bits cannot be traced shapeless, so it sits between two compiled halves.
_plain_parts = mx.compile(lambda scores: _exp_parts(_shifted(scores)), shapeless=True)
_normalise = mx.compile(_normalised, shapeless=True)


def fast_exp(x: mx.array) -> mx.array:
    """exp(x) for float32 x <= 0, uncompiled (for tests)."""
    power, bits = _exp_parts(x)
    return power * bits.view(mx.float32)


def _softmax(parts: tuple[mx.array, mx.array]) -> mx.array:
    power, bits = parts
    return _normalise(power, bits.view(mx.float32))


def _causal(queries: int, keys: int) -> mx.array:
    return mx.arange(keys - queries, keys)[:, None] >= mx.arange(keys)[None]


# From this many scores of a prompt chunk (more than one query a sequence), softmax runs in numpy,
# which waits for the scores in every layer but is several times faster than the compiled loop
# above. Decoding (one query a sequence) keeps MLX's path, so its layers never wait on Python.
NUMPY_MIN_SCORES = 1 << 16

# Scores per block of queries: softmax's passes then stay in the CPU's cache.
BLOCK_SCORES = 1 << 19


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask) -> mx.array:
    """Scaled dot-product attention, queries (B, H, L, D), keys and values (B, KV, T, D); long
    query runs go through in blocks of queries."""
    batch, heads, length, _ = queries.shape
    total = keys.shape[2]
    block = max(1, BLOCK_SCORES // (batch * heads * total))
    if block >= length:
        return _attention(queries, keys, values, scale, mask)
    if isinstance(mask, str):
        mask = _causal(length, total)
    outputs = []
    for start in range(0, length, block):
        rows = slice(start, start + block)
        part = None if mask is None else mask[..., rows, :]
        outputs.append(_attention(queries[:, :, rows], keys, values, scale, part))
    return mx.concatenate(outputs, axis=2)


def _attention(queries, keys, values, scale, mask) -> mx.array:
    batch, heads, length, dim = queries.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    repeats = heads // kv_heads
    dtype = queries.dtype
    q = (queries.astype(mx.float32) * scale).reshape(batch, kv_heads, repeats * length, dim)
    scores = q @ keys.astype(mx.float32).swapaxes(-1, -2)
    if mask is not None:
        if isinstance(mask, str):
            mask = _causal(length, total)
        scores = scores.reshape(batch, kv_heads, repeats, length, total)
        if mask.ndim == 3:  # (1 or H, L, T)
            mask = mask[None]
        if mask.ndim == 4:  # (B, 1 or H, L, T)
            mask = mask.reshape(mask.shape[0], -1, 1, length, total)
            if mask.shape[1] == heads:
                mask = mask.reshape(mask.shape[0], kv_heads, repeats, length, total)
        # applied before the compiled part, which then only ever sees contiguous scores
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(mx.float32).min)
        else:
            scores = scores + mask.astype(mx.float32)
        scores = scores.reshape(batch, kv_heads, repeats * length, total)
    if length > 1 and scores.size >= NUMPY_MIN_SCORES:
        weights, row_scale = _numpy_softmax(scores)
        out = (weights @ values.astype(mx.float32)) * row_scale
    else:
        weights = _softmax(_plain_parts(scores))
        out = weights @ values.astype(mx.float32)
    return out.reshape(batch, heads, length, values.shape[-1]).astype(dtype)


def _numpy_softmax(scores: mx.array) -> tuple[mx.array, mx.array]:
    """Softmax's weights before normalisation, and 1 / their sum per row (applied to the far
    smaller output instead), computed by numpy. Waits for `scores`."""
    mx.eval(scores)
    plain = np.asarray(scores)
    shifted = plain - plain.max(axis=-1, keepdims=True)
    np.exp(shifted, out=shifted)
    return mx.array(shifted), mx.array(1.0 / shifted.sum(axis=-1, keepdims=True))


# Below this many scores (batch x heads x queries x keys) MLX's own kernel is as fast: the
# compiled loop's fixed cost is then most of its time. A batch of decode rows passes it long
# before each row's keys would (measured at 218ddc8: docs/benchmarks.md, past experiments).
MIN_SCORES = 1 << 11
# A compiled reduction over one key crashes MLX 0.32 when traced shapeless.
MIN_KEYS = 2


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's `models.base.scaled_dot_product_attention`, with `attention` on the CPU."""
    if (
        hasattr(cache, "bits")
        or sinks is not None
        or keys.shape[2] < MIN_KEYS
        or queries.size // queries.shape[-1] * keys.shape[2] < MIN_SCORES
    ):
        return _mlx_lm_attention(queries, keys, values, cache, scale, mask, sinks)
    return attention(queries, keys, values, scale, mask)


def _mlx_lm_attention(*args):
    from mlx_lm.models import base

    return base.scaled_dot_product_attention(*args)


def use_vectorised_attention(model) -> bool:
    """Point the model's modules at `scaled_dot_product_attention` above (the policy calls this
    on the CPU only). mlx-lm's model files import the function by name, so the swap is per
    module."""
    from mlx_lm.models import base

    names = {type(layer).__module__ for _, layer in model.named_modules()}
    modules = [
        sys.modules[name]
        for name in sorted(names)
        if getattr(sys.modules.get(name), "scaled_dot_product_attention", None)
        is base.scaled_dot_product_attention
    ]
    for module in modules:
        module.scaled_dot_product_attention = scaled_dot_product_attention
    if modules:
        log.info("CPU backend: attention with a vectorised exp (%s)", modules[0].__name__)
    return bool(modules)
