"""Where a prompt's state is kept for a model whose caches cannot be trimmed."""

from __future__ import annotations

from mlxserve.engine.prefix.checkpoints import CHECKPOINT_EVERY, checkpoint_positions, segments


def test_a_short_prompt_is_kept_before_its_last_token_and_at_its_marks():
    assert checkpoint_positions(100, 0, [40]) == [40, 99]


def test_marks_inside_the_cached_part_or_at_the_last_token_are_left_out():
    assert checkpoint_positions(100, 50, [10, 50, 99, 100, 120]) == [99]


def test_a_long_prompt_is_kept_every_few_thousand_positions_from_its_start():
    length = 3 * CHECKPOINT_EVERY + 10
    every = [CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY]
    assert checkpoint_positions(length, 0, []) == [*every, length - 1]
    # positions count from the prompt's start, whatever came from the cache
    assert checkpoint_positions(length, CHECKPOINT_EVERY + 5, []) == [*every[1:], length - 1]


def test_segments_cover_the_uncached_prompt_and_end_with_its_last_token_alone():
    prompt = list(range(50))
    pieces = segments(prompt, 10, [30])
    assert pieces == [list(range(10, 30)), list(range(30, 49)), [49]]
    assert segments(prompt, 49, [30]) == [[49]]
