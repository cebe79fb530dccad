"""A layer pipeline for any mlx-lm model whose forward pass is embedding -> `layers` -> norm ->
head, where mlx-lm has none (Llama, SmolLM2, Phi-3, Gemma, ...). Each rank keeps a run of
consecutive layers (only their weights are ever read) and their KV; the first of them receives
the hidden state from the rank before, the last sends it on, and every rank gathers the last
stage's state, so every rank computes the same logits. Stages run in mlx-lm's order (the
highest rank holds the first layers, rank 0 the last) and `--layer-split` counts by rank as
mlx-lm's `pipeline(group, split)` does, so both kinds of pipeline split alike.

The model's own forward pass runs unchanged over the shorter list, so the architectures it
suits are those whose pass treats every layer alike: `pipeline_refusal` reads the pass and says
why one that picks layers by position cannot be split this way.
"""

from __future__ import annotations

import inspect
import re

import mlx.core as mx

from ...module_calls import with_call

# Indexes into the per-layer caches a forward pass may use: the first layer's, and Llama's first
# full-attention and sliding-window layers' (recomputed for the rank's own layers)
_CACHE_INDEXES = ("0", "self.fa_idx", "self.swa_idx")


def pipeline_refusal(model) -> str | None:
    """Why this module's pipeline cannot split `model`, or None where it can."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, list) or not layers:
        return "it has no list of layers to split"
    try:
        source = inspect.getsource(type(inner).__call__)
    except (OSError, TypeError):
        return "its forward pass's source cannot be read"
    if "self.layers" not in source or "self.layers[" in source:
        return "its forward pass does not run its layers one after another"
    if "enumerate(" in source:
        return "its forward pass treats each layer by its position"
    for index in re.findall(r"cache\[([^\]]*)\]", source):
        if index.strip() not in _CACHE_INDEXES:
            return f"its forward pass reads cache[{index}] (a layer by its position)"
    return None


def install(model, group: mx.distributed.Group, split: list[int]) -> tuple[int, int]:
    """Keep this rank's layers of `model` (`split[r]` layers on rank r) and make them a stage of
    the pipeline; (first, last + 1): which of the model's layers this rank runs."""
    rank, size = group.rank(), group.size()
    inner = model.model
    start = sum(split[rank + 1 :])
    end = start + split[rank]
    local = inner.layers[start:end]
    if rank < size - 1:
        _receiving(local[0], rank + 1, group)
    _sending(local[-1], rank - 1 if rank > 0 else None, group)
    inner.layers = local
    _reindex(inner)
    return start, end


def _receiving(layer, source: int, group) -> None:
    """`layer` reads the hidden state the rank before sends, not its own input."""
    base = type(layer)

    def __call__(self, x, *args, **kwargs):
        return base.__call__(
            self, mx.distributed.recv_like(x, source, group=group), *args, **kwargs
        )

    with_call(layer, "Receiving", __call__)


def _sending(layer, destination: int | None, group) -> None:
    """After `layer`, its output goes to the next stage's rank (none after the last stage), and
    every rank gathers the last stage's. The send is made a dependency of the layer's KV, so a
    step that evaluates only the caches (a prompt's chunk) still sends."""
    base = type(layer)

    def __call__(self, *args, **kwargs):
        h = base.__call__(self, *args, **kwargs)
        if destination is not None:
            h = mx.distributed.send(h, destination, group=group)
            cache = _cache_among(args, kwargs)
            if cache is not None and isinstance(getattr(cache, "keys", None), mx.array):
                cache.keys = mx.depends(cache.keys, h)
        return mx.distributed.all_gather(h, group=group)[: h.shape[0]]

    with_call(layer, "Sending", __call__)


def _cache_among(args, kwargs):
    if "cache" in kwargs:
        return kwargs["cache"]
    return next((a for a in args if hasattr(a, "update_and_fetch")), None)


def _reindex(inner) -> None:
    """Point a forward pass's layer indexes (Llama's first full-attention and sliding-window
    layer) at this rank's own layers."""
    if hasattr(inner, "fa_idx"):
        full = [i for i, layer in enumerate(inner.layers) if not getattr(layer, "use_sliding", 0)]
        inner.fa_idx = full[0] if full else 0
    if hasattr(inner, "swa_idx"):
        sliding = [i for i, layer in enumerate(inner.layers) if getattr(layer, "use_sliding", 0)]
        inner.swa_idx = sliding[0] if sliding else None


def split_by_memory(layers: int, memory: list[int]) -> list[int]:
    """`layers` over the ranks in proportion to each one's memory, each at least one (the
    largest remainders get the layers left over)."""
    total = sum(memory)
    shares = [layers * m / total for m in memory]
    counts = [max(1, int(s)) for s in shares]
    while sum(counts) > layers:
        over = [r for r in range(len(counts)) if counts[r] > 1]
        counts[max(over, key=lambda r: counts[r] - shares[r])] -= 1
    while sum(counts) < layers:
        counts[max(range(len(counts)), key=lambda r: shares[r] - counts[r])] += 1
    return counts
