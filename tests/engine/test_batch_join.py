"""The KV copies saved when prompts join and sequences leave mlx-lm's decode batch
(`engine/batch_join.py`): the same caches and the same decoding as mlx-lm's own methods."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

from mlxserve.engine.mlx_lm_compat import batch_join

from ..batch_decoding import decode_all


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


@pytest.mark.parametrize("left_padding", [[0], [3]])
def test_extract_of_the_only_row_is_mlx_lms(left_padding):
    cache = _cache(1, 200, 512, left_padding, seed=4)
    expected, actual = cache.extract(0), batch_join._extract(cache, 0)
    assert _same([actual.keys, actual.values], [expected.keys, expected.values])
    assert actual.offset == expected.offset == 200 - left_padding[0]


def test_extract_of_a_row_of_several_is_mlx_lms():
    cache = _cache(2, 100, 256, [0, 10], seed=5)
    expected, actual = cache.extract(1), batch_join._extract(cache, 1)
    assert _same([actual.keys, actual.values], [expected.keys, expected.values])


def _layers(rows: int, used: int, capacity: int, seed: int, layers: int = 3) -> list:
    return [_cache(rows, used, capacity, [0] * rows, seed=seed + i) for i in range(layers)]


def test_a_prompt_that_would_cost_a_big_copy_joins_as_a_group_of_its_own(monkeypatch):
    monkeypatch.setattr(batch_join, "MERGE_BUDGET_BYTES", 1 << 20)
    batch = batch_join.join_caches(_layers(1, 40, 256, seed=10), _layers(1, 30, 256, seed=11))
    assert batch_join.rows_of(batch[0]) == 2  # cheap: merged, one rectangular batch
    kept = [layer.keys for layer in batch]
    deep = _layers(1, 3000, 3072, seed=20)
    joined = batch_join.join_caches(batch, deep)
    groups = batch_join.groups_of(joined)
    assert [batch_join.rows_of(g[0]) for g in groups] == [2, 1]
    assert all(g.keys is k for g, k in zip(groups[0], kept))  # the running rows: not copied
    assert groups[1] == deep  # nor the prompt's
    joined[0].filter([2])  # the first group's rows leave: it is dropped, the rest untouched
    assert joined[0].groups == [deep[0]] and deep[0].keys.shape[2] == 3072
    assert joined[0].nbytes == deep[0].nbytes


def test_prompts_of_a_depth_alike_merge_up_to_a_bigger_copy(monkeypatch):
    monkeypatch.setattr(batch_join, "MERGE_BUDGET_BYTES", 0)
    batch = _layers(8, 60, 256, seed=60)  # eight short streams, then eight short prompts
    joined = batch_join.join_caches(batch, _layers(8, 20, 256, seed=70))
    assert joined is batch and batch_join.rows_of(joined[0]) == 16
    joined = batch_join.join_caches(joined, _layers(1, 1500, 1536, seed=80))  # a deep one: apart
    assert [batch_join.rows_of(g[0]) for g in batch_join.groups_of(joined)] == [16, 1]
    monkeypatch.setattr(batch_join, "MERGE_ALIKE_BYTES", 1000)  # alike, but a big copy: apart
    joined = batch_join.join_caches(joined, _layers(1, 1400, 1536, seed=90))
    assert [batch_join.rows_of(g[0]) for g in batch_join.groups_of(joined)] == [16, 1, 1]


def _never_merged(monkeypatch):
    monkeypatch.setattr(batch_join, "MERGE_BUDGET_BYTES", 0)
    monkeypatch.setattr(batch_join, "MERGE_SLACK_POSITIONS", 0)
    monkeypatch.setattr(batch_join, "MERGE_SLACK_SHARE", 0)


def test_groups_are_capped(monkeypatch):
    _never_merged(monkeypatch)
    joined = _layers(1, 10, 256, seed=40)
    for n in range(batch_join.MAX_GROUPS + 2):
        joined = batch_join.join_caches(joined, _layers(1, 20 + 10 * n, 256, seed=50 + n))
    groups = batch_join.groups_of(joined)
    assert [batch_join.rows_of(g[0]) for g in groups] == [1] * (batch_join.MAX_GROUPS - 1) + [4]
