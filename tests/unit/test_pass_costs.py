"""Pass costs learnt while serving: a width once timed slow is tried again some steps later,
as a row's acceptance recovers (a step that waited on something else must not turn drafting
off for the server's life)."""

from __future__ import annotations

import pytest

from mlxserve.speculation.pass_costs import PRIOR_COST_PER_DRAFT, DraftModelPassCosts, PassCosts
from mlxserve.speculation.planner import DraftPlanner

WIDTHS = (2, 4, 8, 16)


def slow_costs(times_plain: float) -> PassCosts:
    costs = PassCosts()
    costs.observe(1, 0, 0.010)
    for width in WIDTHS:
        costs.observe(1, width, 0.010 * times_plain)
    return costs


def test_recovering_pulls_each_timed_width_towards_its_prior():
    costs = slow_costs(5.0)
    before = costs.relative_cost(1, 8)
    costs.recover(1)
    assert costs.relative_cost(1, 8) < before
    for _ in range(300):
        costs.recover(1)
    assert costs.relative_cost(1, 8) == pytest.approx(1 + PRIOR_COST_PER_DRAFT * 8, rel=1e-3)
    assert costs.relative_cost(2, 8) == 1 + PRIOR_COST_PER_DRAFT * 8 * 2  # untimed: the prior


def test_a_row_that_drafts_well_drafts_again_after_its_widths_were_timed_slow():
    planner = DraftPlanner(draft_tokens=8, costs=slow_costs(5.0))
    planner.admit(7)
    tokens = [1, 2, 3, 4] * 20  # a loop: every lookup finds 8 drafts
    widths = [planner.width([7], [tokens], [100]) for _ in range(200)]
    assert widths[0] == 0  # the slow timings hold it back at first
    assert any(widths), "never tried again"
    first = widths.index(next(w for w in widths if w))
    assert first > 10  # not at once: the timings count for a while


def test_a_draft_models_untimed_widths_cost_what_the_timed_ones_cost_a_draft():
    """Timed: width 2 at 2.5 plain steps (the draft model's two passes in it). Width 8, not
    timed, is taken at 1 + 0.75 * 8, not the prior's 1.16 (tried once, it cost every row a
    slow step); a timed width stays as timed, and no drift pulls it back."""
    costs = DraftModelPassCosts()
    costs.observe(1, 0, 0.1)
    costs.observe(1, 2, 0.25)
    assert costs.relative_cost(1, 8) == pytest.approx(7.0)
    assert costs.relative_cost(1, 2) == pytest.approx(2.5)
    assert costs.relative_cost(1, 1) == pytest.approx(PassCosts().relative_cost(1, 1))
    for _ in range(100):
        costs.recover(1)
    assert costs.relative_cost(1, 2) == pytest.approx(2.5)


def test_one_slow_step_moves_no_cost_and_drafting_never_costs_less_than_not():
    """A plain step timed at 0.316 s among ones of 0.07 s (the process paused), as a server
    measured: with a running mean, width 2 (0.17 s) looked cheaper than a plain step and a row
    that kept nothing drafted at every step."""
    costs = PassCosts()
    for seconds in (0.07, 0.316, 0.07):
        costs.observe(1, 0, seconds)
    costs.observe(1, 2, 0.17)
    assert costs.relative_cost(1, 2) == pytest.approx(0.17 / 0.07)
    costs.observe(1, 4, 0.05)  # faster than a plain step: a timing fluke, not a cheap pass
    assert costs.relative_cost(1, 4) == 1.0
