"""Growing batch KV caches ahead of need, a few layers per engine step.

mlx-lm's `BatchKVCache` grows when a step's tokens no longer fit: every layer at once, by 256
positions, each growth copying the layer's whole cache into fresh memory. Deep into a long prompt,
or with a long sequence in the decode batch, that one step copies hundreds of MB (SmolLM2-135M in
float32 keeps 46 KB per position) while every running stream waits on it. Growing layers before
they fill, within a byte budget per step, spreads that copying over many steps; a prompt's cache
is grown once, to the whole prompt.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from .batch_join import groups_of

# Bytes of KV one step may reallocate; at least one layer grows per step that needs it. Fresh
# memory is slow to touch on a CPU, so a long prompt's layers grow one a step.
STEP_BUDGET_BYTES = 8 << 20
# A decode batch's layers grow once fewer than this many positions are free...
DECODE_HEADROOM = 64
# ...by this many: about mlx-lm's own step, so a cache is rarely more than this over-allocated.
DECODE_GROWTH = 256


def _capacity(cache: BatchKVCache) -> int:
    return cache.keys.shape[2]


def _grow(cache: BatchKVCache, size: int) -> int:
    """Reallocate the layer to hold `size` positions, keeping its content; returns its bytes."""
    used = cache._idx
    spare = [(0, 0), (0, 0), (0, size - used), (0, 0)]
    cache.keys = mx.pad(cache.keys[..., :used, :], spare)
    cache.values = mx.pad(cache.values[..., :used, :], spare)
    return cache.keys.nbytes + cache.values.nbytes


def reserve(caches: list, needed: int, size: int, budget: int = STEP_BUDGET_BYTES) -> int:
    """Grow the layers holding fewer than `needed` positions to `size`, emptiest first, until
    `budget` bytes are reallocated. Only plain `BatchKVCache` layers with content are grown
    (rotating, quantized and state-space caches are left to mlx-lm). Returns the layers grown."""
    short = [
        c
        for c in caches
        if type(c) is BatchKVCache and c.keys is not None and _capacity(c) < needed
    ]
    short.sort(key=_capacity)
    grown, spent = [], 0
    for cache in short:
        if grown and spent >= budget:
            break
        spent += _grow(cache, max(size, needed))
        grown.append(cache)
    # Queued now, not waited for. Left lazy, a layer was copied by the first forward pass that
    # reached it: with a chunk spread over passes, several layers grown in earlier steps at once,
    # a step twice as long as its neighbours.
    if grown:
        mx.async_eval([(cache.keys, cache.values) for cache in grown])
    return len(grown)


def reserve_for_generator(generator, budget: int = STEP_BUDGET_BYTES) -> int:
    """Grow the caches of mlx-lm's `BatchGenerator` ahead of its next steps: the prompt batch's
    to hold its longest remaining prompt, the decode batch's to keep `DECODE_HEADROOM` free.
    Returns the layers grown. Reads mlx-lm 0.32's generator internals; does nothing if they
    change."""
    grown = 0
    prompts = getattr(generator, "_prompt_batch", None)
    processing = getattr(generator, "_currently_processing", None)
    if prompts is not None and processing and len(prompts) == len(processing):
        layers = prompts.prompt_cache
        if layers and isinstance(layers[0], BatchKVCache):
            remaining = max(total - done for _, done, total in processing)
            end = layers[0]._idx + remaining
            # room to decode after joining the decode batch, which keeps this capacity
            grown += reserve(layers, end, end + DECODE_GROWTH, budget)
    decoding = getattr(generator, "_generation_batch", None)
    if decoding is not None and len(decoding):
        for layers in groups_of(decoding.prompt_cache):  # each group of the batch grows apart
            if layers and isinstance(layers[0], BatchKVCache):
                used = layers[0]._idx
                grown += reserve(layers, used + DECODE_HEADROOM, used + DECODE_GROWTH, budget)
    return grown
