"""How many tokens a verify pass drafts, for the batch as it is: the rows' acceptance so far
against what a wider pass costs at the batch's size.

Every row of a pass pays its width (the rows are padded to the longest draft), so the width is
chosen for the batch: the one that emits the most tokens per unit of pass time, each row's
drafts kept one after the other with its own acceptance rate. Alone, a row drafts freely; in a
compute-bound batch, only rows that are usually right make a wider pass pay.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTHS = (0, 2, 4, 8, 16)  # drafted tokens a pass may carry
PRIOR_ACCEPTANCE = 0.5  # a row's acceptance before it has drafted
PRIOR_TOKENS = 2.0  # drafts the prior counts for in a row's acceptance
DECAY = 0.5  # weight each verify pass leaves the row's earlier ones
RECOVERY = 0.05  # pull towards the prior of each step a row had drafts but was not let draft
MAX_BACKOFF = 6  # the recovery halves for each pass in a row whose drafts were all refused
PRIOR_WEIGHT = 16  # drafts the prior counts for in a draft model's pair prior


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens a row emits from a pass with `drafted` drafts, each kept with probability
    `acceptance` until the first refusal, then the target's own: 1 + a + ... + a^drafted."""
    return sum(acceptance**i for i in range(drafted + 1))


@dataclass
class Acceptance:
    """A row's chance that a draft is kept, given the one before it was: its kept drafts over
    kept drafts and refusals, the latest passes weighted most. A pass that kept every draft
    refused none: the copy it follows may run on, so a few such passes let the row draft wide
    (a mean of each pass's kept share rose by a fixed step a pass, so a row copying a file took
    several passes of drafts all kept before it drafted wide)."""

    kept: float
    refused: float

    @classmethod
    def starting_at(cls, rate: float) -> Acceptance:
        return cls(rate * PRIOR_TOKENS, (1 - rate) * PRIOR_TOKENS)

    @property
    def rate(self) -> float:
        total = self.kept + self.refused
        return self.kept / total if total > 0 else PRIOR_ACCEPTANCE

    def record(self, drafted: int, kept: int) -> None:
        """A verify pass's outcome (a pass without drafts changes nothing)."""
        if drafted:
            self.kept = DECAY * self.kept + kept
            self.refused = DECAY * self.refused + (kept < drafted)

    def move_to(self, rate: float) -> None:
        """The rate set to `rate`, the weight of what it has seen kept."""
        total = self.kept + self.refused or PRIOR_TOKENS
        self.kept, self.refused = rate * total, (1 - rate) * total


def pair_prior(drafted: int, accepted: int) -> float:
    """A draft model's row starts from how often the pair has agreed so far (the draft's
    agreement with the model is the pair's, learnt across requests): PRIOR_ACCEPTANCE
    counted as PRIOR_WEIGHT drafts, then every draft verified."""
    return (accepted + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (drafted + PRIOR_WEIGHT)


def recovered_acceptance(
    acceptance: float, misses: int = 0, prior: float = PRIOR_ACCEPTANCE
) -> float:
    """A row kept from drafting by its low acceptance is let try again after a while: what it
    copies changes (a chat turns to quoting code), and only a draft can show it. `misses`:
    its last passes in a row that kept nothing; each one doubles the wait (a draft model that
    never agrees would otherwise cost a wide pass every few steps). `prior`: where it recovers
    to (the row's start)."""
    rate = RECOVERY * 0.5 ** min(max(0, misses - 1), MAX_BACKOFF)
    return acceptance + rate * (prior - acceptance)


def choose_width(
    acceptances: Sequence[float],
    available: Sequence[int],
    relative_cost: Callable[[int, int], float],
    widths: Sequence[int] = WIDTHS,
) -> int:
    """The drafts a pass carries: the width among `widths` whose tokens per unit of time are
    the most, for rows of `acceptances` with `available` drafts each (prompt lookup finds
    fewer, or none); `relative_cost(rows, width)`: a pass's time over the plain pass's."""
    rows = len(acceptances)

    def rate(width: int) -> float:
        tokens = sum(expected_tokens(a, min(width, n)) for a, n in zip(acceptances, available))
        return tokens / relative_cost(rows, width)

    return max(widths, key=lambda width: (rate(width), -width))


def measured_costs(table: dict[int, dict[int, float]]) -> Callable[[int, int], float]:
    """`relative_cost` from measured passes: {rows: {width: time over the plain pass}},
    interpolated linearly in the width, at the smallest measured row count at or above `rows`
    (the largest beyond them)."""
    counts = sorted(table)

    def cost(rows: int, width: int) -> float:
        measured = table[counts[min(bisect_left(counts, rows), len(counts) - 1)]]
        points = sorted({0: 1.0, **measured}.items())
        for (w0, c0), (w1, c1) in zip(points, points[1:]):
            if width <= w1:
                return c0 + (c1 - c0) * (width - w0) / (w1 - w0)
        (w0, c0), (w1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) * (width - w1) / (w1 - w0)

    return cost
