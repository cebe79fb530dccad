"""A vision tower's attention cut into passes by its queries' rows, so that an image beside
running streams never holds them for one whole attention over all of its patches.

Each query row's softmax reads every key but no other query, so attention computed for the rows
a chunk at a time is the same attention. While a prefill's graph is built (`rows_chunked`),
unmasked attention (mlx-vlm's vision towers attend an image at a time without a mask) is split
that way, and each chunk's output is recorded for a pass of its own: MLX's fused attention, and
mlx-vlm's compiled wrapper of it that some families' towers call instead (compiled, its chunks
could not be recorded from inside it, so each chunk is a call of it).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx

# The most query-key scores a chunk computes a head: a quarter of a 448-pixel image's patches
# against all of them
MAX_SCORES = 256 * 1024
WRAPPERS = ("ensure_fused_sdpa",)  # mlx-vlm's attention functions a family's module imports

_install_lock = threading.Lock()
_users = 0
_fused = mx.fast.scaled_dot_product_attention
_local = threading.local()  # .record: the chunks' outputs, on the thread building its graph


def _by_rows(attention: Callable) -> Callable:
    """`attention(queries, keys, values, scale, mask=None, ...)` a chunk of query rows at a
    time where a graph is being recorded on this thread and there is no mask."""

    def chunked(queries, keys, values, *args, **kwargs):
        record = getattr(_local, "record", None)
        mask = kwargs.get("mask", args[1] if len(args) > 1 else None)
        step = max(1, MAX_SCORES // max(1, keys.shape[-2]))
        if record is None or mask is not None or queries.shape[-2] <= step:
            return attention(queries, keys, values, *args, **kwargs)
        _local.record = None  # a compiled wrapper's trace calls MLX's attention: not recorded
        try:
            parts = [
                attention(queries[..., start : start + step, :], keys, values, *args, **kwargs)
                for start in range(0, queries.shape[-2], step)
            ]
        finally:
            _local.record = record
        record.extend(parts)
        return mx.concatenate(parts, axis=-2)

    return chunked


_fused_by_rows = _by_rows(_fused)


@contextmanager
def rows_chunked(record: list, family_module: str | None = None) -> Iterator[None]:
    """Within it, on this thread, unmasked attention over more than MAX_SCORES scores a head is
    computed a chunk of query rows at a time, each chunk's output appended to `record`: MLX's
    fused attention, and mlx-vlm's wrappers of it where `family_module` (the tower's module's
    name) imports them."""
    global _users
    module = sys.modules.get(family_module or "")
    wrapped = {name: getattr(module, name) for name in WRAPPERS if hasattr(module, name)}
    with _install_lock:
        if _users == 0:
            mx.fast.scaled_dot_product_attention = _fused_by_rows
        _users += 1
        for name, function in wrapped.items():
            setattr(module, name, _by_rows(function))
    _local.record = record
    try:
        yield
    finally:
        _local.record = None
        with _install_lock:
            for name, function in wrapped.items():
                setattr(module, name, function)
            _users -= 1
            if _users == 0:
                mx.fast.scaled_dot_product_attention = _fused
