"""A model whose attention heads do not split over the ranks is refused at load with the numbers,
instead of mlx-lm's shape error in the first forward pass (SmolLM2's 9 heads over 2 ranks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxserve.engine.distributed import DistributedError, _check_heads_split


def model(heads: int, kv_heads: int | None):
    return SimpleNamespace(
        args=SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads)
    )


def test_heads_that_do_not_divide_are_refused_with_the_numbers():
    with pytest.raises(
        DistributedError, match="9 attention heads \\(3 key/value heads\\).* 2 ranks"
    ):
        _check_heads_split(model(9, 3), 2)


@pytest.mark.parametrize("heads, kv_heads, ranks", [(9, 3, 3), (4, 2, 2), (32, 8, 4), (8, None, 2)])
def test_heads_that_divide_pass(heads, kv_heads, ranks):
    _check_heads_split(model(heads, kv_heads), ranks)


def test_grouped_heads_must_divide_too():
    with pytest.raises(DistributedError):
        _check_heads_split(model(8, 1), 2)
