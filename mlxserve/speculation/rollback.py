"""Drafted positions a row rejected, taken out of the batch's KV caches after a verify pass.

A verify pass writes the same number of positions for every row (the last token and its drafts,
padded to the longest draft), but each row keeps its own number of them. mlx-lm's `BatchKVCache`
has one write position for the batch and a left padding per row, so the batch's smallest
rejection is trimmed, and each row's remaining rejected tail is rolled round to its left, where
its padding is masked: as mlx-lm's own `finalize` turns right padding into left padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, dynamic_roll


def roll_back(caches: Sequence[BatchKVCache], rejected: Sequence[int]) -> None:
    """Drop each row's last `rejected[row]` positions from every layer's cache."""
    common = min(rejected)
    rest = [count - common for count in rejected]
    for cache in caches:
        if common:
            cache.trim(common)
        if any(rest):
            shifts = mx.array(rest)
            cache.keys = dynamic_roll(cache.keys, shifts[:, None], axis=2)
            cache.values = dynamic_roll(cache.values, shifts[:, None], axis=2)
            cache.offset = cache.offset - shifts
            cache.left_padding = cache.left_padding + shifts
