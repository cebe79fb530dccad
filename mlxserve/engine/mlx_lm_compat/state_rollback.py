"""Rejected drafts taken back out of caches that cannot be trimmed: a linear-attention or
state-space layer's state, a sliding window that has wrapped round.

Such a state after a verify pass has read every drafted token, and no position can be cut out
of it. So the batch's caches are kept as they stand before the pass (`StateSnapshot`), and where
a row kept fewer tokens than the pass fed it, they are put back and fed again with what each row
kept, right-padded as mlx-lm's own prefill pads rows of unequal lengths (`refeed`). A pass where
every row kept all it was fed needs neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, CacheList

from .batch_join import KVGroups


class StateSnapshot:
    """Each layer's attributes as they stand. Large arrays are kept by reference: a pass
    replaces a state or a window rather than writing into it (a plain KV writes in place only
    past its write position, which the snapshot puts back). Small ones (offsets, paddings,
    lengths) are copied, as a pass changes them in place (`-=`). Lists (an `ArraysCache`'s
    states, which a layer sets by index) are copied; the arrays in them are not."""

    def __init__(self, layers: Sequence) -> None:
        self._saved = [(layer, _attributes(layer)) for layer in _leaves(layers)]

    def restore(self) -> None:
        for layer, attributes in self._saved:
            vars(layer).update(attributes)


def refeed(model, layers: Sequence, snapshot: StateSnapshot, fed: mx.array, kept: list[int]):
    """Put `layers` back to `snapshot` and feed each row the first `kept[row] + 1` of its `fed`
    tokens (the token the pass started from and the drafts it kept). The logits are not asked
    for: the state is what this pass is for."""
    snapshot.restore()
    lengths = [count + 1 for count in kept]
    longest = max(lengths)
    padding = [longest - length for length in lengths]
    padded = any(padding)
    if padded:
        for layer in layers:
            layer.prepare(lengths=lengths, right_padding=padding)
    model(fed[:, :longest], cache=layers)
    if padded:
        for layer in layers:
            layer.finalize()


def positional(layers: Sequence) -> bool:
    """Every layer is a plain KV, whose rows drop their last positions (`rollback.roll_back`)."""
    return all(isinstance(layer, BatchKVCache | KVGroups) for layer in layers)


def _leaves(layers: Sequence) -> list:
    found = []
    for layer in layers:
        if isinstance(layer, CacheList):
            found += _leaves(layer.caches)
        else:  # (KV groups are plain KV's alone: `positional`, never snapshot)
            found.append(layer)
    return found


def _attributes(layer) -> dict:
    return {name: _kept(value) for name, value in vars(layer).items()}


def _kept(value):
    if isinstance(value, mx.array):
        return mx.array(value) if value.ndim <= 1 else value
    if isinstance(value, list):
        return list(value)
    return value
