"""Rows whose positions are not their token indexes: a prompt with images, prefilled by its
vision-language model (Qwen's M-RoPE gives an image's tokens fewer positions than tokens), goes on
from its own position.

A `BatchKVCache` keeps each row's `offset` (the position rotary embeddings read) apart from the
buffer's index, and carries it through extend and filter; only its merge, which builds a batch
from single sequences' caches, computes it from their lengths. `install()` wraps that merge so a
sequence's cache with a `rope_shift` attribute (`vision/tower.py`) starts its row that much
further on.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

_mlx_lm_merge = BatchKVCache.merge.__func__


def _merge(cls, caches):
    merged = _mlx_lm_merge(cls, caches)
    shifts = [getattr(c, "rope_shift", 0) for c in caches]
    if any(shifts):
        merged.offset = merged.offset + mx.array(shifts)
    return merged


def install() -> None:
    """Wrap mlx-lm's `BatchKVCache.merge` (idempotent)."""
    BatchKVCache.merge = classmethod(_merge)
