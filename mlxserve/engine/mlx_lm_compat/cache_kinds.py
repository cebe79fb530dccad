"""What a model's layers keep between tokens, and what the engine may do with it.

mlx-lm's models keep one of several kinds of cache a layer: a plain `KVCache` (a position per
token, cut anywhere), a `RotatingKVCache` (a sliding window's ring buffer), an `ArraysCache`
(linear attention's or a state-space layer's state, a fixed size whatever the length) and
others. Only a model whose every layer keeps plain positions can have a row's KV sliced, copied
a few layers a step, trimmed to a shared prefix, or rolled back after rejected drafts; any other
is reused from snapshots of its whole state, taken where a prompt may be continued
(`prefix/checkpoints.py`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    _BaseCache,
    make_prompt_cache,
)

from ...planning.model_facts import PLAIN_KV

PLAIN = PLAIN_KV
WINDOW = "sliding window"
STATE = "linear attention / state space"
QUANTIZED = "quantized"
OTHER = "other"


def layer_kind(cache) -> str:
    """The kind of one layer's cache (a batch's or one sequence's)."""
    if isinstance(cache, CacheList):
        kinds = {layer_kind(c) for c in cache.caches}
        return kinds.pop() if len(kinds) == 1 else OTHER
    if isinstance(cache, RotatingKVCache | BatchRotatingKVCache):
        return WINDOW
    if isinstance(cache, ArraysCache):
        return STATE
    if isinstance(cache, QuantizedKVCache):
        return QUANTIZED
    if isinstance(cache, KVCache | BatchKVCache):  # the packed kinds (--kv-bits) subclass them
        return PLAIN
    return OTHER


@dataclass(frozen=True)
class CacheLayout:
    """The kinds of cache a model's layers keep, in the order they first appear."""

    kinds: tuple[str, ...]

    @classmethod
    def of(cls, model) -> CacheLayout:
        seen: dict[str, None] = {}
        for layer in make_prompt_cache(model):
            seen.setdefault(layer_kind(layer), None)
        return cls(tuple(seen))

    @property
    def positional(self) -> bool:
        """Every layer keeps one position per token, which can be cut off anywhere."""
        return self.kinds == (PLAIN,)

    def describe(self) -> str:
        return " and ".join(self.kinds)


def detached(caches: list) -> list:
    """A copy of one sequence's caches sharing no buffer with the batch it came from: a
    checkpoint must not hold the batch's buffers alive, and a buffer something else holds is
    copied whole at its next write in place. (`copy.deepcopy` shares an array's buffer.)"""
    snapshot = [_detached(c) for c in caches]
    mx.eval([c.state for c in snapshot])
    return snapshot


def _detached(value):
    if isinstance(value, mx.array):
        return mx.array(value)  # always a copy (`mx.contiguous` shares a contiguous slice)
    if isinstance(value, list | tuple):
        return type(value)(_detached(v) for v in value)
    if not isinstance(value, _BaseCache):
        return value
    copied = copy.copy(value)
    plain = isinstance(value, KVCache) and value.keys is not None
    for name, attribute in vars(value).items():
        if not (plain and name in ("keys", "values")):
            setattr(copied, name, _detached(attribute))
    if plain:  # its positions, not the capacity grown ahead of them
        copied.keys = mx.array(value.keys[..., : value.offset, :])
        copied.values = mx.array(value.values[..., : value.offset, :])
    return copied
