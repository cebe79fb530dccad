"""Fewer copies of the KV when a prompt joins, or a sequence leaves, mlx-lm's decode batch.

A prompt that ends its prefill moves from mlx-lm's prompt batch into the decode batch; running
streams wait for that step. mlx-lm 0.32 copies the prompt's whole KV four times on the way:
`PromptProcessingBatch.split` deep-copies the prompt batch, then gathers the rows it keeps, and
`BatchKVCache.extend` pads each side, then concatenates. When a sequence leaves, `filter` gathers
every kept row at the batch's full length before it trims their shared left padding. Beside a
long prompt each copy is hundreds of MB of fresh, page-faulted buffer on the CPU.

`install()` replaces those three methods with ones that give the same caches with one copy:
a split of the whole batch moves it; extend writes both sides into one new buffer; filter trims
before it gathers. Anything else falls through to mlx-lm's own code.

Even one copy is a step of its own beside a deep prompt: its KV is rectangular with the batch's,
so joining copies the prompt's whole KV and pads every running row to its depth, and leaving
copies the rest back. Where `mixed_batch` runs the decode pass, the decode batch can instead be
made of groups (`KVGroups`): a prompt whose join would copy more than `MERGE_BUDGET_BYTES` joins
as a group of its own, with no copy (unless the depths are alike and the copy moderate), and each
group is attended apart. A group whose last row leaves is dropped, again with no copy, and its
row's KV is handed out as it is (`_extract`).
"""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache, KVCache

from .quantized_kv import empty_like

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
_mlx_lm_extract = BatchKVCache.extract

# A joining prompt's KV is merged into the decode batch's last group when that copies at most
# this many bytes, all layers together (a few ms on a CPU); else it joins as a group of its own:
# a long prompt's merge is a step several times a stream's usual gap.
MERGE_BUDGET_BYTES = 32 << 20
# ...or when it pads the rows by at most this many positions each, or this share of what they use,
# and copies at most MERGE_ALIKE_BYTES: groups of similar depth are cheaper merged (one attention
# call per layer, not one per group), up to a copy that would itself be a long step.
MERGE_SLACK_POSITIONS = 256
MERGE_SLACK_SHARE = 0.25
MERGE_ALIKE_BYTES = 256 << 20
# Each group is attended apart (a handful of small ops per layer): past this many, a joining
# prompt merges whatever the copy costs.
MAX_GROUPS = 4


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


def _extract(cache: BatchKVCache, idx: int):
    """A row's KV as a `KVCache` (of the batch's kind: packed, for quantized KV); the only row's
    is handed out uncopied. mlx-lm's callers extract a row that is about to leave the batch (it
    finished, or was removed), so nothing writes the buffer afterwards, and the copy would only
    delay the streams' next token."""
    if cache.keys is None:
        return _mlx_lm_extract(cache, idx)
    row = row_view(cache, idx)
    if cache.offset.shape[0] != 1:
        row.keys, row.values = mx.contiguous(row.keys), mx.contiguous(row.values)
    return row


def row_view(cache, idx: int) -> KVCache:
    """Row `idx` of a decode batch's layer (a `BatchKVCache` or `KVGroups`) as a `KVCache` that
    views the batch's buffers: nothing is copied until something evaluates a copy of it."""
    if isinstance(cache, KVGroups):
        cache, idx = cache.locate(idx)
    padding = cache.left_padding[idx].item()
    row = empty_like(cache)
    row.keys = cache.keys[idx : idx + 1, :, padding : cache._idx]
    row.values = cache.values[idx : idx + 1, :, padding : cache._idx]
    row.offset = cache._idx - padding
    return row


def rows_of(cache: BatchKVCache) -> int:
    return cache.offset.shape[0]


class KVGroups:
    """One layer's KV for a decode batch made of several `BatchKVCache` groups, each holding a run
    of the batch's rows, in order. mlx-lm's `GenerationBatch` calls `filter`, `extract` and
    `nbytes`; only `mixed_batch.mixed_forward` attends over it, each group apart."""

    def __init__(self, groups: list[BatchKVCache]):
        self.groups = groups

    def filter(self, keep: list[int]) -> None:
        """Keep the rows `keep` (sorted, as mlx-lm passes them); a group left with none is
        dropped, one left whole is untouched."""
        kept, start = [], 0
        for group in self.groups:
            rows = rows_of(group)
            local = [i - start for i in keep if start <= i < start + rows]
            start += rows
            if local and len(local) < rows:
                group.filter(local)
            if local:
                kept.append(group)
        self.groups = kept

    def locate(self, idx: int) -> tuple[BatchKVCache, int]:
        """The group holding the batch's row `idx`, and the row's index in it."""
        for group in self.groups:
            if idx < rows_of(group):
                return group, idx
            idx -= rows_of(group)
        raise IndexError("row out of the batch")

    def extract(self, idx: int):
        group, idx = self.locate(idx)
        return group.extract(idx)

    @property
    def nbytes(self) -> int:
        return sum(group.nbytes for group in self.groups)


def groups_of(layers: list) -> list[list]:
    """The decode batch's caches as groups, each a list of one cache per layer."""
    if not layers or not isinstance(layers[0], KVGroups):
        return [layers]
    return [list(group) for group in zip(*(layer.groups for layer in layers))]


def _merge_bytes(mine: BatchKVCache, theirs: BatchKVCache) -> int:
    """Bytes `_extend` would write to merge `theirs` into `mine` (one layer)."""
    rows = rows_of(mine) + rows_of(theirs)
    size = max(mine.keys.shape[2], theirs.keys.shape[2], mine._idx, theirs._idx)
    per_position = sum(a.shape[1] * a.shape[3] * a.itemsize for a in (mine.keys, mine.values))
    return rows * size * per_position


def _pads_little(mine: BatchKVCache, theirs: BatchKVCache) -> bool:
    """Whether merging leaves the rows' attention about as long as apart (similar depths)."""
    rows = rows_of(mine) + rows_of(theirs)
    apart = rows_of(mine) * mine._idx + rows_of(theirs) * theirs._idx
    padding = rows * max(mine._idx, theirs._idx) - apart
    return padding <= max(MERGE_SLACK_POSITIONS * rows, MERGE_SLACK_SHARE * apart)


def join_caches(mine: list, theirs: list) -> list:
    """The decode batch's caches (one per layer) after the rows of `theirs`, a prompt batch's
    `BatchKVCache`s, join it: merged into the last group (mlx-lm's way, one copy) when that is
    cheap or the depths are alike, else appended as a group of their own."""
    groups = groups_of(mine)
    last = groups[-1]
    groupable = all(type(c) is BatchKVCache and c.keys is not None for c in [*last, *theirs])
    merge_bytes = sum(_merge_bytes(a, b) for a, b in zip(last, theirs)) if groupable else 0
    if (
        not groupable
        or len(groups) >= MAX_GROUPS
        or merge_bytes <= MERGE_BUDGET_BYTES
        or (merge_bytes <= MERGE_ALIKE_BYTES and _pads_little(last[0], theirs[0]))
    ):
        for layer, other in zip(last, theirs):
            layer.extend(other)
        return mine
    if not isinstance(mine[0], KVGroups):
        mine = [KVGroups([layer]) for layer in mine]
    for layer, other in zip(mine, theirs):
        layer.groups.append(other)
    return mine


def install() -> None:
    """Swap the methods into mlx-lm's classes (idempotent)."""
    PromptProcessingBatch.split = _split
    BatchKVCache.extend = _extend
    BatchKVCache.filter = _filter
    BatchKVCache.extract = _extract
