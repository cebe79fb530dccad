"""Quantized KV caches inside the batch (--kv-bits): a position's keys, or values, held as one
row of uint32 words, the quantized words then their scales and biases.

mlx-lm 0.32 quantizes one sequence's KV (`QuantizedKVCache`) but has no batched cache for it.
Packed this way, quantized KV is an array like any other to mlx-lm's `BatchKVCache` and to ours
(joins, filters, growth, prefix copies, files on disk), which move it as they move float KV; only
writing positions (`update_and_fetch`) and reading them for attention know what it holds. The
caches carry `bits` and `group_size`, so the models' attention takes mlx-lm's quantized path.

The model's `make_cache` hands them out (`install`), so every cache mlx-lm or mlxserve makes for
the model is one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from ...settings import QUANTIZED_KV_GROUP_SIZES as GROUP_SIZES


@dataclass(frozen=True)
class Packing:
    bits: int
    group_size: int
    dtype: mx.Dtype | None = None  # what was quantized (scales and biases are of it)

    def __deepcopy__(self, memo) -> Packing:  # immutable (and an mx.Dtype cannot be pickled)
        return self

    def words(self, head_dim: int) -> int:
        return head_dim * self.bits // 32

    def pack(self, x: mx.array) -> mx.array:
        """(..., D) floats -> (..., W) uint32: quantized words, then scales and biases."""
        words, scales, biases = mx.quantize(x, group_size=self.group_size, bits=self.bits)
        meta = mx.concatenate([scales, biases], axis=-1).view(mx.uint32)
        return mx.concatenate([words, meta], axis=-1)

    def unpack(self, packed: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(..., W) uint32 -> mlx-lm's (words, scales, biases)."""
        width, size = packed.shape[-1], self.dtype.size
        # W = D * bits / 32 + 2 * (D / group) * size / 4, solved for D
        head_dim = round(width * 32 * self.group_size / (self.bits * self.group_size + 16 * size))
        split = self.words(head_dim)
        meta = packed[..., split:].view(self.dtype)
        groups = meta.shape[-1] // 2
        return packed[..., :split], meta[..., :groups], meta[..., groups:]


def packing_of(cache) -> Packing | None:
    return getattr(cache, "packing", None)


class _Packed:
    """What a packed cache adds to mlx-lm's: positions packed as they are written (`fetch`
    unpacks the ones written so far), and `bits` and `group_size`, which send the models'
    attention down mlx-lm's quantized path."""

    packing: Packing

    @property
    def bits(self) -> int:
        return self.packing.bits

    @property
    def group_size(self) -> int:
        return self.packing.group_size

    def update_and_fetch(self, keys, values):
        if self.packing.dtype is None:
            self.packing = Packing(self.packing.bits, self.packing.group_size, keys.dtype)
        super().update_and_fetch(self.packing.pack(keys), self.packing.pack(values))
        return tuple(self.packing.unpack(kv) for kv in self.keys_and_values())


class QuantizedRowKVCache(_Packed, KVCache):
    """One sequence's KV, packed (the prompt caches mlx-lm makes per row, the prefix cache's)."""

    def __init__(self, packing: Packing):
        super().__init__()
        self.packing = packing

    @classmethod
    def merge(cls, caches):
        return QuantizedBatchKVCache.merge(caches)


class QuantizedBatchKVCache(_Packed, BatchKVCache):
    """A batch's KV, packed: mlx-lm's `BatchKVCache` over packed rows."""

    packing = Packing(8, 64)  # the merged rows' (`merge`)

    @classmethod
    def merge(cls, caches):
        if max(c.size() for c in caches) == 0:  # mlx-lm's would be a plain BatchKVCache
            merged = cls([0] * len(caches))
        else:
            merged = BatchKVCache.merge.__func__(cls, caches)
        merged.packing = next(
            (c.packing for c in caches if c.packing.dtype is not None), caches[0].packing
        )
        return merged


def empty_like(cache) -> KVCache:
    """An empty one-sequence cache of `cache`'s kind (a row of a batch, a copy of a row)."""
    packing = packing_of(cache)
    return KVCache() if packing is None else QuantizedRowKVCache(packing)


def backend_refusal(head_dim: int, bits: int, group_size: int) -> str | None:
    """None where MLX on the default device runs quantized attention for this head size (one
    query and several, grouped query heads), else its error: its GPU backends implement the
    quantized matmul for some shapes only."""
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    keys = mx.quantize(mx.ones((1, 1, 5, head_dim)), group_size=group_size, bits=bits)
    try:
        for queries in (1, 5):
            out = quantized_scaled_dot_product_attention(
                mx.ones((1, 2, queries, head_dim)), keys, keys, 1.0, None, group_size, bits
            )
            mx.eval(out)
    except RuntimeError as error:
        return str(error)
    return None


def install(model, bits: int, group_size: int) -> None:
    """Make every plain KV cache made for `model` (by `make_prompt_cache`) a packed one; a
    sliding window's or a state-space layer's cache stays as the model makes it. Raises
    ValueError, saying why, for a model with no plain KV layer, with attention sinks (which
    MLX's quantized attention does not take), or whose head size `group_size` does not
    divide."""
    kind = type(model).__module__.rsplit(".", 1)[-1]
    own_cache = getattr(model, "make_cache", None)
    layers = len(model.layers)
    own = own_cache() if own_cache is not None else [KVCache() for _ in range(layers)]
    plain = [type(c) is KVCache for c in own]
    if not any(plain):
        raise ValueError(
            f"--kv-bits: {kind} models keep no plain KV cache (sliding windows or state-space "
            "layers only), so nothing would be quantized; serve it without --kv-bits"
        )
    if any(hasattr(module, "sinks") for _, module in model.named_modules()):
        raise ValueError(
            f"--kv-bits: {kind} models attend with sinks, which MLX's quantized attention does "
            "not take; serve it without --kv-bits"
        )
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    head_dim = getattr(args, "head_dim", None) or (
        args.hidden_size // heads if heads and getattr(args, "hidden_size", None) else None
    )
    if head_dim is not None and head_dim % group_size:
        fits = [g for g in GROUP_SIZES if head_dim % g == 0]
        raise ValueError(
            f"--kv-group-size {group_size} does not divide this model's head size {head_dim}"
            + (f"; use {' or '.join(map(str, fits))}" if fits else "; it cannot be quantized")
        )
    if head_dim is not None and (refusal := backend_refusal(head_dim, bits, group_size)):
        raise ValueError(
            f"--kv-bits {bits} --kv-group-size {group_size}: MLX on this device has no quantized "
            f"attention for this model's head size {head_dim} ({refusal}); serve it without "
            "--kv-bits"
        )
    packing = Packing(bits, group_size)

    def make_cache() -> list:
        made = own_cache() if own_cache is not None else [None] * layers
        return [QuantizedRowKVCache(packing) if p else c for p, c in zip(plain, made)]

    model.make_cache = make_cache
