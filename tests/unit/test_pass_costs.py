"""Pass costs learnt while serving: a width once timed slow is tried again some steps later,
as a row's acceptance recovers (a step that waited on something else must not turn drafting
off for the server's life); but where every width was timed as dear, again and again, none is
lured back."""

from __future__ import annotations

import pytest

from mlxserve.speculation.pass_costs import (
    PRIOR_COST_PER_DRAFT,
    TRUSTED_SAMPLES,
    WINDOW,
    DraftModelPassCosts,
    PassCosts,
)
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


def timed_per_draft(rows: int, per_draft: float, times: int = TRUSTED_SAMPLES) -> PassCosts:
    """Every width timed `times` times at `rows` rows, at 1 + `per_draft` x width plain steps."""
    costs = PassCosts()
    for _ in range(times):
        costs.observe(rows, 0, 0.010)
        for width in WIDTHS:
            costs.observe(rows, width, 0.010 * (1 + per_draft * width))
    return costs


def test_where_every_width_was_timed_as_dear_none_is_lured_back():
    """A batch of 16 rows of a small model (stories260k, `MLXSERVE_PORTABLE=1`): a pass cost
    about 1.1 plain steps more a draft, where the prior says 0.32 (0.02 x 16 rows). Pulled
    towards the prior, the widths were retried every few dozen steps, each a step of 4 to 18
    plain ones, and drafting cost the batch a fifth of its tokens/s."""
    costs = timed_per_draft(16, 1.1)
    before = {width: costs.relative_cost(16, width) for width in WIDTHS}
    for _ in range(300):
        costs.recover(16)
    assert {width: costs.relative_cost(16, width) for width in WIDTHS} == before
    planner = DraftPlanner(draft_tokens=16, costs=costs)
    uids = list(range(16))
    for uid in uids:
        planner.admit(uid)
        planner.rows[uid].acceptance = 0.9  # rows copying: nearly every draft kept
    loops = [[1, 2, 3, 4] * 20] * 16  # every lookup finds its drafts
    assert not any(planner.width(uids, loops, [400] * 16) for _ in range(300))


def test_a_width_timed_dearer_than_the_others_recovers_towards_what_they_cost_a_draft():
    """Widths 2 to 16 timed thrice at 0.05 plain steps a draft; then width 8 a whole window at
    5 plain steps (a stretch where its steps waited on something else): it recovers to 1.4,
    what the others would cost at its width, not to the prior's 1.16."""
    costs = timed_per_draft(1, 0.05)
    for _ in range(WINDOW):
        costs.observe(1, 8, 0.050)
    assert costs.relative_cost(1, 8) == pytest.approx(5.0)
    for _ in range(300):
        costs.recover(1)
    assert costs.relative_cost(1, 8) == pytest.approx(1 + 0.05 * 8, rel=1e-3)
    assert costs.relative_cost(1, 2) == pytest.approx(1 + 0.05 * 2)  # never made dearer


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
