"""The verify pass's width follows the rows' acceptance and the batch's size, on the pass costs
benchmarks/speculation_ceiling.py --pass-costs measured here (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from mlxserve.speculation.draft_length import (
    Acceptance,
    choose_width,
    expected_tokens,
    measured_costs,
)

# Medians of the three runs in docs/benchmarks.md: rows -> {drafted tokens: pass time / plain}
MEASURED = measured_costs(
    {
        1: {2: 1.19, 4: 1.36, 8: 1.50},
        4: {2: 1.35, 4: 1.67, 8: 2.11},
        16: {2: 1.59, 4: 2.41, 8: 4.11},
    }
)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 8) == 9
    assert expected_tokens(0.0, 8) == 1


def test_one_row_that_is_usually_right_drafts_the_most():
    assert choose_width([0.9], [8], MEASURED) == 8
    assert choose_width([0.5], [8], MEASURED) == 2


def test_a_full_batch_drafts_only_when_its_rows_are_right():
    assert choose_width([0.2] * 16, [8] * 16, MEASURED) == 0
    assert choose_width([0.95] * 16, [8] * 16, MEASURED) in (4, 8)
    assert choose_width([0.5] * 16, [8] * 16, MEASURED) <= choose_width([0.5], [8], MEASURED)


def test_rows_with_nothing_to_draft_do_not_pay_for_a_wide_pass():
    assert choose_width([0.9] * 4, [0] * 4, MEASURED) == 0
    # one row of four with drafts: worth a wide pass only if that row is usually right
    assert choose_width([0.5, 0.9, 0.9, 0.9], [8, 0, 0, 0], MEASURED) == 0
    assert choose_width([0.9, 0.9, 0.9, 0.9], [8, 0, 0, 0], MEASURED) == 8


def test_acceptance_follows_what_rows_keep():
    acceptance = Acceptance.starting_at(0.5)
    for _ in range(20):
        acceptance.record(drafted=4, kept=4)
    assert acceptance.rate > 0.99
    before = acceptance.rate
    acceptance.record(drafted=0, kept=0)
    assert acceptance.rate == before
    for _ in range(20):
        acceptance.record(drafted=4, kept=0)
    assert acceptance.rate < 0.01


def test_passes_that_keep_every_draft_widen_the_next_at_once():
    """A row copying its prompt keeps all it drafts, pass after pass: after a pass of 2 and
    one of 8, all kept, it drafts 16 (a mean of each pass's kept share stayed at 8)."""
    acceptance = Acceptance.starting_at(0.5)
    widths = []
    for _ in range(3):
        width = choose_width([acceptance.rate], [16], MEASURED)
        widths.append(width)
        acceptance.record(drafted=width, kept=width)
    assert widths == [2, 8, 16]
    # the copy ends: passes that keep nothing narrow it again
    for _ in range(2):
        acceptance.record(drafted=widths[-1], kept=0)
    assert choose_width([acceptance.rate], [16], MEASURED) < widths[-1]


def test_costs_are_interpolated_between_and_beyond_measured_points():
    assert MEASURED(1, 0) == 1.0
    assert MEASURED(1, 3) == pytest.approx((1.19 + 1.36) / 2)
    assert MEASURED(3, 8) == 2.11  # the next measured row count up: 4
    assert MEASURED(64, 8) == 4.11  # beyond the largest: the largest's
    assert MEASURED(1, 16) > 1.50
