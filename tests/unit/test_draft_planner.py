"""A row whose drafts are refused stops drafting, and is let try again later: sooner after a
pass that kept something, later after each pass in a row that kept nothing (a draft model that
never agrees must not cost a wide pass every few steps)."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.speculation.pass_costs import DraftModelPassCosts, PassCosts
from mlxserve.speculation.planner import DraftPlanner, DraftTotals

from .test_draft_length import MEASURED


@dataclass
class DraftModelStandIn:
    """What the planner reads of a draft model (speculation/draft_model.py) when it only
    chooses widths: no drafts are asked of it here. `judged`, `agreed`: its own drafts the
    model verified, and kept."""

    judged: int = 0
    agreed: int = 0
    joined: int = 0


class MeasuredCosts(PassCosts):
    """The pass costs measured here (test_draft_length.MEASURED), fixed."""

    def relative_cost(self, rows: int, width: int) -> float:
        return MEASURED(rows, width)


def drafting_steps(planner: DraftPlanner, steps: int, kept_at=()) -> list[int]:
    """The steps at which a lone row with a repeating text (its lookup always finds drafts)
    drafts; every pass's drafts are refused but at the steps `kept_at` (all kept)."""
    planner.admit(0)
    tokens = [1, 2, 3, 4] * 8
    tried = []
    for step in range(steps):
        current = tokens[-4]
        width = planner.width([0], [tokens], [10**6])
        if width:
            (drafts,) = planner.drafts([0], [tokens], [current], width, [10**6])
            kept = len(drafts) if any(at <= step for at in kept_at) else 0
            kept_at = [at for at in kept_at if at > step]
            planner.record([0], [drafts], [kept])
            tried.append(step)
        tokens = tokens + [current]
    return tried


def test_each_refused_try_doubles_the_wait_before_the_next():
    tried = drafting_steps(DraftPlanner(costs=MeasuredCosts()), 1500)
    gaps = [b - a for a, b in zip(tried, tried[1:])]
    assert len(gaps) >= 5
    assert all(later >= earlier for earlier, later in zip(gaps[2:], gaps[3:]))
    assert gaps[-1] >= 8 * gaps[1]


def test_a_kept_pass_ends_the_backoff():
    alone = drafting_steps(DraftPlanner(costs=MeasuredCosts()), 1500)
    kept_at = alone[6]
    tried = drafting_steps(DraftPlanner(costs=MeasuredCosts()), 1500, kept_at=[kept_at])
    after = [step for step in tried if step > kept_at]
    assert after[0] - kept_at < alone[7] - alone[6]  # the next try comes sooner
    assert len(tried) > len(alone)


def test_a_draft_models_rows_start_from_the_pairs_agreement_so_far():
    """A draft model's agreement is the pair's: a pair whose own drafts were kept 2 of 200
    does not try a wide pass at each new request's start, whatever else was drafted and kept
    (a grammar's forced tokens: the totals); prompt lookup's rows start from the prior."""
    poor = DraftPlanner(
        costs=MeasuredCosts(), model=DraftModelStandIn(200, 2), totals=DraftTotals(400, 202)
    )
    poor.admit(0)
    assert poor.rows[0].acceptance < 0.1
    assert poor.width([0], [[1, 2, 3]], [100]) == 0
    good = DraftPlanner(
        costs=MeasuredCosts(), model=DraftModelStandIn(200, 180), totals=DraftTotals(200, 180)
    )
    good.admit(0)
    assert good.rows[0].acceptance > 0.8 and good.width([0], [[1, 2, 3]], [100]) > 0
    for fresh in (
        DraftPlanner(model=DraftModelStandIn()),
        DraftPlanner(totals=DraftTotals(200, 2)),
    ):
        fresh.admit(0)
        assert fresh.rows[0].acceptance == 0.5


def test_a_draft_models_timed_costs_stay_what_they_were_timed():
    """Prompt lookup's timed widths drift back to the prior while unused (a slow step may have
    waited on something else); a draft model's include its own passes, which the prior does
    not know of, so they stay."""
    for model, costs, drifts in (
        (None, PassCosts(), True),
        (DraftModelStandIn(), DraftModelPassCosts(), False),
    ):
        costs.observe(1, 0, 1.0)
        costs.observe(1, 2, 1.5)
        planner = DraftPlanner(costs=costs, model=model, totals=DraftTotals(200, 2))
        planner.admit(0)
        for _ in range(200):
            planner.rows[0].acceptance = 0.01  # never worth a pass: each step recovers
            assert planner.width([0], [[1, 2, 3, 1, 2, 3, 1, 2]], [100]) == 0
        assert (costs.relative_cost(1, 2) < 1.2) == drifts


def test_a_grammars_forced_tokens_count_in_the_totals_not_in_the_rows_acceptance():
    """Tokens a grammar forces are kept whatever the model says: a JSON row whose passes kept
    every forced key and none of its own drafts has its own drafts' acceptance (it drafted
    wide in the record's free text when they counted), while /metrics' totals count every
    token the passes carried."""
    planner = DraftPlanner(costs=MeasuredCosts())
    planner.admit(0)
    start = planner.rows[0].acceptance
    planner.record([0], [[5, 6, 7, 8]], [4], [4])  # forced tokens only: all kept
    assert planner.rows[0].acceptance == start and planner.rows[0].misses == 0
    for _ in range(3):
        planner.record([0], [[5, 6, 7, 8, 9, 10]], [4], [4])  # a key forced, own two refused
    alone = DraftPlanner(costs=MeasuredCosts())
    alone.admit(0)
    for _ in range(3):
        alone.record([0], [[9, 10]], [0])
    assert planner.rows[0].acceptance == alone.rows[0].acceptance < start
    assert planner.rows[0].misses == 3
    assert (planner.totals.drafted, planner.totals.accepted) == (22, 16)
    assert planner.take_verdicts() == {0: (22, 16)}
