"""A verify pass over a batch whose rows keep different numbers of drafted tokens: after the
rejected positions are rolled back, every row decodes exactly as the same row alone, fed only
the tokens it kept."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import BatchKVCache

from mlxserve.speculation.rollback import roll_back

from ..device_numerics import LOGPROB_TOLERANCE
from .verify_rows import alone, assert_each_decodes_as_alone, decoded_after

PROMPTS = [[5, 9, 14, 3, 22, 7], [11, 4], [8, 8, 30, 2]]
# Per row: the tokens a verify pass feeds after its prompt (the last token and 3 drafts), and
# how many of them the row keeps.
FED = [[12, 40, 41, 42], [6, 7, 50, 51], [19, 20, 21, 22]]
KEPT = [1, 3, 4]  # the third row keeps everything, the first only its last token


@pytest.fixture(scope="module")
def model(tiny_model):
    loaded, _ = mlx_lm.load(str(tiny_model))
    return loaded


def batched(model, steps: int, rolled_back=roll_back) -> list[list[mx.array]]:
    """The same rows in one batch, left-padded, through one verify pass and `rolled_back`."""
    longest = max(map(len, PROMPTS))
    padding = [longest - len(p) for p in PROMPTS]
    caches = [BatchKVCache(padding) for _ in model.layers]
    padded = mx.array([[0] * pad + p for pad, p in zip(padding, PROMPTS)])
    model(padded, cache=caches)
    verify = model(mx.array(FED), cache=caches)
    rolled_back(caches, [len(fed) - kept for fed, kept in zip(FED, KEPT)])
    return decoded_after(model, caches, verify, KEPT, steps)


def test_rows_rolled_back_by_different_counts_decode_as_each_alone(model):
    steps = 6
    together = batched(model, steps)
    assert_each_decodes_as_alone(model, together, PROMPTS, FED, KEPT, steps)


def test_without_the_roll_back_a_row_would_differ(model):
    """The check above can fail: the same batch with only the common rejection trimmed, the
    first row's rejected drafts left in its cache."""

    def trim_only(caches, rejected):
        for cache in caches:
            cache.trim(min(rejected))

    together = batched(model, 2, rolled_back=trim_only)
    reference = alone(model, PROMPTS[0] + FED[0][: KEPT[0]], 2)
    assert not mx.allclose(together[0][1], reference[1], atol=LOGPROB_TOLERANCE).item()
