"""KV caches grown ahead of need (`engine/kv_reserve.py`): a long prompt prefilled in chunks beside
a decoding stream, on mlx-lm's own `BatchGenerator` and the tiny model, with and without it."""

from __future__ import annotations

import random

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import BatchGenerator

from mlxserve.engine.kv_reserve import reserve_for_generator


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
    generator = BatchGenerator(model, prefill_step_size=16)
    generator.insert([stream_prompt], max_tokens=[420])
    tokens: dict[int, list[int]] = {}
    logprobs = []
    grown_by_mlx_lm = 0
    for step in range(600):
        if step == 8:
            generator.insert([long_prompt], max_tokens=[40])
        if budget is not None:
            reserve_for_generator(generator, budget)
        before = _capacities(generator)
        prompts, responses = generator.next()
        joined = any(r.end_of_prompt for r in prompts)
        for key, (layer, capacity) in _capacities(generator).items():
            old = before.get(key)
            if not joined and old and old[0] is layer and capacity > old[1]:
                grown_by_mlx_lm += 1
        for r in responses:
            tokens.setdefault(r.uid, []).append(r.token)
            logprobs.append(r.logprobs)
        if step > 8 and not responses:
            break
    generator.close()
    return tokens, mx.stack(logprobs), grown_by_mlx_lm


@pytest.fixture(scope="module")
def model(tiny_model):
    return mlx_lm.load(str(tiny_model))[0]


@pytest.mark.parametrize("budget", [1, 32 << 20])  # one layer a step; all of them
def test_reserved_caches_never_grow_inside_a_step_and_decode_the_same(model, budget):
    plain, plain_logprobs, grown_plain = _run(model, None)
    reserved, reserved_logprobs, grown_reserved = _run(model, budget)
    assert [len(t) for t in plain.values()] == [420, 40]
    assert reserved == plain
    assert mx.array_equal(reserved_logprobs, plain_logprobs)
    assert grown_plain > 0  # without it mlx-lm grows the caches mid-step
    assert grown_reserved == 0
