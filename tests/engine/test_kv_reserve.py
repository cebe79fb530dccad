"""KV caches grown ahead of need (`engine/kv_reserve.py`): a long prompt prefilled in chunks beside
a decoding stream, on mlx-lm's own `BatchGenerator` and the tiny model, with and without it."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import BatchKVCache

from mlxserve.engine.mlx_lm_compat.kv_reserve import reserve, reserve_for_generator

from ..batch_decoding import decode_all


def _layers(generator) -> list:
    return [
        layer
        for batch in (generator._prompt_batch, generator._generation_batch)
        for layer in batch.prompt_cache
    ]


def _capacities(generator) -> dict[int, tuple[object, int]]:
    return {
        id(layer): (layer, layer.keys.shape[2])
        for layer in _layers(generator)
        if layer.keys is not None
    }


def _run(model, budget: int | None) -> tuple[dict[int, list[int]], mx.array, int]:
    """Greedy tokens per sequence, every step's log-probabilities, and how many times mlx-lm
    grew a layer inside a step (other than by joining a prompt to the decode batch, which
    reallocates by design)."""
    rng = random.Random(0)
    stream_prompt = [rng.randrange(3, 1024) for _ in range(12)]
    long_prompt = [rng.randrange(3, 1024) for _ in range(700)]
    grown_by_mlx_lm = 0

    def next_step(generator: BatchGenerator) -> tuple[list, list]:
        nonlocal grown_by_mlx_lm
        if budget is not None:
            reserve_for_generator(generator, budget)
        before = _capacities(generator)
        prompts, responses = generator.next()
        joined = any(r.end_of_prompt for r in prompts)
        for key, (layer, capacity) in _capacities(generator).items():
            old = before.get(key)
            if not joined and old and old[0] is layer and capacity > old[1]:
                grown_by_mlx_lm += 1
        return prompts, responses

    inserts = {0: ([stream_prompt], [420]), 8: ([long_prompt], [40])}
    generator = BatchGenerator(model, prefill_step_size=16)
    tokens, logprobs = decode_all(generator, inserts, next_step)
    return tokens, logprobs, grown_by_mlx_lm


@pytest.mark.parametrize("budget", [1, 32 << 20])  # one layer a step; all of them
def test_reserved_caches_never_grow_inside_a_step_and_decode_the_same(tiny_lm, budget):
    plain, plain_logprobs, grown_plain = _run(tiny_lm, None)
    reserved, reserved_logprobs, grown_reserved = _run(tiny_lm, budget)
    assert [len(t) for t in plain.values()] == [420, 40]
    assert reserved == plain
    assert mx.array_equal(reserved_logprobs, plain_logprobs)
    assert grown_plain > 0  # without it mlx-lm grows the caches mid-step
    assert grown_reserved == 0


def test_a_grown_layer_is_copied_in_the_step_that_grows_it():
    """Not left lazy for whichever later forward pass first reaches it: a chunk spread over
    passes reaches some layers steps later, and their copies then fell into one step."""
    layers = []
    for _ in range(4):
        layer = BatchKVCache([0])
        layer.update_and_fetch(mx.ones((1, 2, 40, 8)), mx.ones((1, 2, 40, 8)))
        layers.append(layer)
    mx.eval([(layer.keys, layer.values) for layer in layers])
    mx.synchronize()
    before = mx.get_active_memory()
    assert reserve(layers, needed=5000, size=5000, budget=1) == 1  # one layer this step
    mx.synchronize()  # waits for queued work; runs nothing that was left lazy
    grown = 2 * 5000 * 2 * 8 * layers[0].keys.itemsize
    assert mx.get_active_memory() - before > 0.9 * grown  # less the old, smaller buffers
