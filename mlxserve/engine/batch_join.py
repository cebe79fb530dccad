"""Fewer copies of the KV when a prompt joins, or a sequence leaves, mlx-lm's decode batch.

A prompt that ends its prefill moves from mlx-lm's prompt batch into the decode batch; running
streams wait for that step. mlx-lm 0.32 copies the prompt's whole KV four times on the way:
`PromptProcessingBatch.split` deep-copies the prompt batch, then gathers the rows it keeps, and
`BatchKVCache.extend` pads each side, then concatenates. When a sequence leaves, `filter` gathers
every kept row at the batch's full length before it trims their shared left padding. Beside a
7,500-token prompt (SmolLM2-135M in float32: 46 KB of KV per position, 345 MB) each copy is a
fresh, page-faulted buffer on the CPU.

`install()` replaces those three methods with ones that give the same caches with one copy:
a split of the whole batch moves it; extend writes both sides into one new buffer; filter trims
before it gathers. Anything else falls through to mlx-lm's own code.
"""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

_BATCH_LISTS = (
    "uids",
    "prompt_cache",
    "tokens",
    "samplers",
    "logits_processors",
    "max_tokens",
    "stop_sequences",
)
_mlx_lm_split = PromptProcessingBatch.split
_mlx_lm_extend = BatchKVCache.extend
_mlx_lm_filter = BatchKVCache.filter


def _split(batch: PromptProcessingBatch, indices: list[int]) -> PromptProcessingBatch:
    """Split off `indices`; all of them: hand the batch over instead of copying it."""
    if sorted(indices) != list(range(len(batch.uids))):
        return _mlx_lm_split(batch, indices)
    moved = copy.copy(batch)
    for name in _BATCH_LISTS:
        setattr(batch, name, [])
    return moved


def _extend(cache: BatchKVCache, other: BatchKVCache) -> None:
    """Append `other`'s rows, right-aligned at the longer side's position as mlx-lm does, written
    once into a single new buffer."""
    if cache.keys is None or other.keys is None or cache.keys.dtype != other.keys.dtype:
        return _mlx_lm_extend(cache, other)
    used = max(cache._idx, other._idx)
    size = max(cache.keys.shape[2], other.keys.shape[2], used)
    rows = cache.keys.shape[0] + other.keys.shape[0]
    merged = []
    for name in ("keys", "values"):
        mine, theirs = getattr(cache, name), getattr(other, name)
        buffer = mx.zeros((rows, mine.shape[1], size, mine.shape[3]), mine.dtype)
        start = 0
        for part, idx in ((mine, cache._idx), (theirs, other._idx)):
            end = start + part.shape[0]
            buffer[start:end, :, used - idx : used] = part[..., :idx, :]
            start = end
        merged.append(buffer)
    cache.keys, cache.values = merged
    cache.left_padding = mx.concatenate(
        [cache.left_padding + (used - cache._idx), other.left_padding + (used - other._idx)]
    )
    cache.offset = mx.concatenate([cache.offset, other.offset])
    cache._idx = used


def _filter(cache: BatchKVCache, batch_indices) -> None:
    """Keep the rows `batch_indices`, trimming their shared left padding before gathering them."""
    if cache.keys is None:
        return _mlx_lm_filter(cache, batch_indices)
    left_padding = cache.left_padding[batch_indices]
    trim = min(left_padding.tolist()) if left_padding.size else 0
    cache.keys = cache.keys[..., trim:, :][batch_indices]
    cache.values = cache.values[..., trim:, :][batch_indices]
    cache.offset = cache.offset[batch_indices]
    cache.left_padding = left_padding - trim
    cache._idx -= trim


def install() -> None:
    """Swap the three methods into mlx-lm's classes (idempotent)."""
    PromptProcessingBatch.split = _split
    BatchKVCache.extend = _extend
    BatchKVCache.filter = _filter
