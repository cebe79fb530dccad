"""A sliding window's one-token prefill pass over right-padded rows, taken by mlx-lm's
concatenating update.

mlx-lm 0.32's `BatchRotatingKVCache` writes a pass of one token in place, and refuses to while
rows are right-padded (`_lengths` set by `prepare`, until `finalize`): "finalize() should be
called before decoding". A prefill of rows of unequal lengths that the server runs in chunks
(segments cut for checkpoints, the pacer's chunk sizes) can leave a last chunk of one token, and
then the step failed with that error. Its concatenating update handles padded rows at any
length, so `install()` sends such a pass there; decoding (no padding) writes in place as
before.
"""

from __future__ import annotations

from mlx_lm.models.cache import BatchRotatingKVCache

_mlx_lm_update = BatchRotatingKVCache.update_and_fetch


def _update_and_fetch(self, keys, values):
    if keys.shape[2] == 1 and self._lengths is not None:
        return self._update_concat(keys, values)
    return _mlx_lm_update(self, keys, values)


def install() -> None:
    """Wrap mlx-lm's `BatchRotatingKVCache.update_and_fetch` (idempotent)."""
    BatchRotatingKVCache.update_and_fetch = _update_and_fetch
