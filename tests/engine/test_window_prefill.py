"""A sliding window's prefill pass of one token over right-padded rows (a row with nothing in
this chunk beside one with a token): mlx-lm 0.32 refuses it ("finalize() should be called
before decoding", a failed step, seen as a 500 on a tiny Ministral 3 with drafts on);
`window_prefill.install()` takes it through mlx-lm's concatenating update, which keeps each
row's own offset."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchRotatingKVCache

from mlxserve.engine.mlx_lm_compat import window_prefill


def one_token_over_padded_rows() -> BatchRotatingKVCache:
    cache = BatchRotatingKVCache(max_size=8, left_padding=[0, 0])
    three = mx.arange(2 * 3 * 4, dtype=mx.float32).reshape(2, 1, 3, 4)
    cache.update_and_fetch(three, three)
    cache.prepare(lengths=[1, 0], right_padding=[0, 1])
    one = mx.full((2, 1, 1, 4), 100.0)
    cache.update_and_fetch(one, one)
    cache.finalize()
    return cache


def test_mlx_lm_alone_refuses_it():
    original = BatchRotatingKVCache.update_and_fetch
    BatchRotatingKVCache.update_and_fetch = window_prefill._mlx_lm_update
    try:
        with pytest.raises(RuntimeError, match="finalize"):
            one_token_over_padded_rows()
    finally:
        BatchRotatingKVCache.update_and_fetch = original


def test_installed_each_row_keeps_its_own_length():
    window_prefill.install()
    cache = one_token_over_padded_rows()
    assert cache.offset.tolist() == [4, 3]  # the first row took its token, the second none
    keys, _ = cache.keys_and_values()
    # the first row's last position is its new token; the second row's last is its own third
    assert keys[0, 0, -1, 0].item() == 100.0
    assert keys[1, 0, -1, 0].item() == 20.0
