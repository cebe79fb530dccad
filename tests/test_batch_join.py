"""The KV copies saved when prompts join and sequences leave mlx-lm's decode batch
(`engine/batch_join.py`): the same caches and the same decoding as mlx-lm's own methods."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

from mlxserve.engine import batch_join

from .batch_decoding import decode_all


@pytest.fixture
def joined(monkeypatch):
    """batch_join's methods in mlx-lm's classes for one test."""
    monkeypatch.setattr(PromptProcessingBatch, "split", batch_join._split)
    monkeypatch.setattr(BatchKVCache, "extend", batch_join._extend)
    monkeypatch.setattr(BatchKVCache, "filter", batch_join._filter)


def _cache(rows: int, used: int, capacity: int, left_padding: list[int], seed: int):
    cache = BatchKVCache(left_padding)
    key = mx.random.key(seed)
    cache.keys = mx.random.normal((rows, 2, capacity, 8), key=key)
    cache.values = mx.random.normal((rows, 2, capacity, 4), key=mx.random.split(key)[0])
    cache._idx = used
    cache.offset = cache.offset + used
    return cache


def _state(cache: BatchKVCache) -> list:
    keys, values = cache.keys_and_values()
    return [keys, values, cache.offset, cache.left_padding, mx.array(cache._idx)]


def _same(a: list, b: list) -> bool:
    return all(x.shape == y.shape and mx.array_equal(x, y) for x, y in zip(a, b))


SHAPES = [  # (rows, used, capacity, left padding) of the batch, then of what joins it
    ((1, 40, 256, [0]), (1, 700, 956, [0])),  # a stream, then a long prompt
    ((2, 700, 768, [660, 0]), (1, 30, 256, [0])),  # a long batch, then a short prompt
    ((3, 100, 100, [0, 5, 50]), (2, 100, 512, [20, 0])),  # equal positions
]


@pytest.mark.parametrize("mine, theirs", SHAPES)
def test_extend_gives_mlx_lms_cache(mine, theirs):
    expected, other = _cache(*mine, seed=1), _cache(*theirs, seed=2)
    expected.extend(other)
    actual, other = _cache(*mine, seed=1), _cache(*theirs, seed=2)
    batch_join._extend(actual, other)
    assert _same(_state(actual), _state(expected))
    assert actual.keys.shape == expected.keys.shape


@pytest.mark.parametrize("keep", [[0], [1], [0, 2], [2, 1]])
def test_filter_gives_mlx_lms_cache(keep):
    expected = _cache(3, 300, 512, [250, 40, 120], seed=3)
    expected.filter(keep)
    actual = _cache(3, 300, 512, [250, 40, 120], seed=3)
    batch_join._filter(actual, keep)
    assert _same(_state(actual), _state(expected))


def _decode(model) -> tuple[dict[int, list[int]], mx.array]:
    """A stream, then a long prompt joining it, then two prompts prefilled together of which one
    ends first (a partial split); greedy tokens and every step's log-probabilities."""
    rng = random.Random(1)
    prompt = lambda n: [rng.randrange(3, 1024) for _ in range(n)]  # noqa: E731
    inserts = {0: ([prompt(10)], [150]), 5: ([prompt(500)], [60])}
    inserts[40] = ([prompt(40), prompt(300)], [30, 30])
    return decode_all(BatchGenerator(model, prefill_step_size=32), inserts, max_steps=400)


@pytest.fixture(scope="module")
def mlx_lms_decoding(tiny_lm):
    return _decode(tiny_lm)


def test_decoding_is_mlx_lms(tiny_lm, mlx_lms_decoding, joined):
    tokens, logprobs = _decode(tiny_lm)
    assert [len(t) for t in tokens.values()] == [150, 60, 30, 30]
    assert tokens == mlx_lms_decoding[0]
    assert mx.array_equal(logprobs, mlx_lms_decoding[1])
