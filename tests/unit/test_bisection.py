"""Halving finds the row that makes a pass fail, whichever it is, in a few steps, and never
blames another."""

from __future__ import annotations

import math

import pytest

from mlxserve.engine.failures.recovery import Bisection, Held


class Row:
    uid = 0


def search(rows: list[Row], culprit: Row) -> tuple[Row | None, int]:
    """Steps of a batch holding `rows` until the bisection names one; (named, steps)."""
    bisection, batch = Bisection(), list(rows)
    for step in range(1, 100):
        if any(r is culprit for r in batch):
            named, out = bisection.failed(batch)
            if named is not None:
                return named, step
            batch = [r for r in batch if not any(r is o for o in out)]
            bisection.held.append([Held(r, 0, 0, None) for r in out])
        else:
            bisection.cleared(batch)  # every row in the batch sent a token
            batch += [h.seq for h in bisection.next_half()]
    return None, 100


@pytest.mark.parametrize("count", [1, 2, 3, 8, 9, 32])
def test_each_row_is_found_when_it_is_the_culprit(count):
    rows = [Row() for _ in range(count)]
    for culprit in rows:
        named, steps = search(rows, culprit)
        assert named is culprit
        assert steps <= 2 * math.ceil(math.log2(count)) + 1


def test_a_failure_outside_the_suspects_starts_the_search_again():
    bisection = Bisection()
    a, b, c = Row(), Row(), Row()
    _, out = bisection.failed([a, b])
    assert len(out) == 1 and len(bisection.testing) == 1
    # a pass without the suspects being tested fails: everyone in it is suspect again
    named, out = bisection.failed([c])
    assert named is c and out == []
