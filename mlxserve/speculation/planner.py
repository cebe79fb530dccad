"""Which rows of a decode batch draft in its next step, and how wide the verify pass is.

The batch samples each row's next token a step ahead, on the device, and does not wait for it
before the next pass. A speculating step must wait (its drafts follow that token), so the step
first looks up each row's drafts from the tokens it already has, the first of them a guess at
the token not yet read: where nothing matches, or the batch's rows are seldom right, the step
runs as a plain one and waits for nothing. Otherwise it reads the tokens, looks up again after
each, and verifies the drafts it finds. With a draft model (`draft_model.ModelDrafter`) every
row it admits has drafts: they come from that model's passes, after the tokens are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .draft_length import (
    PRIOR_ACCEPTANCE,
    WIDTHS,
    Acceptance,
    choose_width,
    pair_prior,
    recovered_acceptance,
)
from .ngram import DEFAULT_NGRAM_MAX, DEFAULT_NGRAM_MIN, NgramDrafter
from .pass_costs import PassCosts

if TYPE_CHECKING:  # the draft model's module imports MLX; the front reads this one's constants
    from .draft_model import ModelDrafter

DEFAULT_DRAFT_TOKENS = 16  # the most drafts a row carries in one pass (llama.cpp's --draft-max)
MAX_DRAFT_TOKENS = 32  # what a request or the server may ask for


@dataclass
class RowDrafts:
    """One row's drafting: its most drafts a pass, its n-gram index (built at its first step),
    and how often its drafts were kept."""

    limit: int
    drafter: NgramDrafter | None = None
    prior: float = PRIOR_ACCEPTANCE  # where its acceptance starts, and recovers to
    misses: int = 0  # its last verify passes in a row that kept none of its drafts
    kept: Acceptance = field(init=False)  # how often its drafts are kept, from `prior` on

    def __post_init__(self) -> None:
        self.kept = Acceptance.starting_at(self.prior)

    @property
    def acceptance(self) -> float:
        return self.kept.rate

    @acceptance.setter
    def acceptance(self, rate: float) -> None:
        self.kept.move_to(rate)


@dataclass
class DraftTotals:
    drafted: int = 0  # tokens drafted and verified
    accepted: int = 0  # of them, kept
    passes: int = 0  # verify passes


@dataclass
class DraftPlanner:
    """Drafting for the rows of one batch, by row uid: prompt lookup, or `model`'s drafts."""

    draft_tokens: int = DEFAULT_DRAFT_TOKENS  # a row's most drafts a pass, unless it asks
    n_min: int = DEFAULT_NGRAM_MIN
    n_max: int = DEFAULT_NGRAM_MAX
    costs: PassCosts = field(default_factory=PassCosts)
    totals: DraftTotals = field(default_factory=DraftTotals)
    rows: dict[int, RowDrafts] = field(default_factory=dict)
    model: ModelDrafter | None = None
    # rows' (drafted, kept) since the engine last took them (`take_verdicts`): per request counts
    verdicts: dict[int, tuple[int, int]] = field(default_factory=dict)

    def admit(self, uid: int, limit: int | None = None) -> None:
        """Row `uid` drafts up to `limit` tokens a pass (None: `draft_tokens`; 0: never)."""
        limit = self.draft_tokens if limit is None else limit
        if limit > 0:
            prior = PRIOR_ACCEPTANCE
            if self.model is not None:  # the pair's agreement so far; prompt lookup's is the text's
                prior = pair_prior(self.model.judged, self.model.agreed)
            self.rows[uid] = RowDrafts(limit, prior=prior)

    def drafting(self, uid: int) -> bool:
        return uid in self.rows

    def limit(self, uid: int) -> int:
        """Row `uid`'s most drafts a pass."""
        return self.rows[uid].limit

    def forget(self, uids: Sequence[int]) -> None:
        for uid in uids:
            self.rows.pop(uid, None)
        if self.model is not None:
            self.model.forget(uids)

    def reset(self) -> None:
        """Rebuild every row's index (or draft KV) from the batch at its next step (a step
        failed part-way)."""
        for row in self.rows.values():
            row.drafter = None
        if self.model is not None:
            self.model.reset()

    def width(
        self, uids: Sequence[int], tokens: Sequence[list[int]], remaining: Sequence[int]
    ) -> int:
        """The drafts the next pass would carry, from lookups on each row's `tokens` (those in
        its KV, not yet the one sampled after them); 0: a plain step. `remaining`: tokens each
        row may still emit after that one."""
        if self.model is not None:
            self.model.joined = 0
        if not self.rows:
            return 0
        acceptances, available, limits = [], [], [0]
        for uid, row_tokens, left in zip(uids, tokens, remaining):
            row = self.rows.get(uid)
            if row is None or left <= 0:
                acceptances.append(0.0)
                available.append(0)
                continue
            if self.model is None:
                guess = self._synced(row, row_tokens).draft(row.limit + 1)  # the token to come,
                found = len(guess) - 1  # then its drafts
            else:
                found = row.limit
            acceptances.append(row.acceptance)
            available.append(max(0, min(found, row.limit, left)))
            limits.append(row.limit)
        if not any(available):
            return 0
        widths = sorted({w for w in WIDTHS if w <= max(limits)} | {max(limits)})
        width = choose_width(acceptances, available, self.costs.relative_cost, widths)
        if width == 0:
            for uid, count in zip(uids, available):
                if count:
                    row = self.rows[uid]
                    row.acceptance = recovered_acceptance(row.acceptance, row.misses, row.prior)
            self.costs.recover(len(uids))
        return width

    def drafts(
        self,
        uids: Sequence[int],
        tokens: Sequence[list[int]],
        current: Sequence[int],
        width: int,
        remaining: Sequence[int],
    ) -> list[list[int]]:
        """Each row's drafts after its `current` token (now read), at most `width`."""
        if self.model is not None:
            return self._model_drafts(uids, tokens, current, width, remaining)
        out = []
        for uid, token, left in zip(uids, current, remaining):
            row = self.rows.get(uid)
            if row is None or row.drafter is None or left <= 0:
                out.append([])
                continue
            row.drafter.append(token)
            out.append(row.drafter.draft(min(width, row.limit, left)))
        return out

    def record(
        self,
        uids: Sequence[int],
        drafts: Sequence[Sequence[int]],
        kept: Sequence[int],
        forced: Sequence[int] | None = None,
    ) -> None:
        """A verify pass's outcome: each row's drafts, and how many it kept. `forced`: how many
        of each row's drafts lead as its grammar's forced tokens, which are kept whatever the
        model says: the totals count them, the row's acceptance (what its own drafts are
        worth) does not."""
        totals = self.totals
        totals.passes += 1
        forced = forced or [0] * len(uids)
        for uid, count, accepted, given in zip(uids, map(len, drafts), kept, forced):
            row = self.rows.get(uid)
            if row is None or not count:
                continue
            if count > given:
                row.kept.record(count - given, max(0, accepted - given))
                row.misses = 0 if accepted > given else row.misses + 1
            totals.drafted += count
            totals.accepted += accepted
            before = self.verdicts.get(uid, (0, 0))
            self.verdicts[uid] = (before[0] + count, before[1] + accepted)
        if self.model is not None:
            self.model.record(dict(zip(uids, kept)), dict(zip(uids, drafts)))

    def not_verified(self) -> None:
        """The drafts of the last `drafts` call go to no verify pass (a grammar allowed none of
        them): the draft model's KV lets them go."""
        if self.model is not None:
            self.model.record({}, {})

    def take_verdicts(self) -> dict[int, tuple[int, int]]:
        """Each row's (drafted, kept) tokens since the last call."""
        verdicts, self.verdicts = self.verdicts, {}
        return verdicts

    def _model_drafts(self, uids, tokens, current, width, remaining) -> list[list[int]]:
        """The draft model's drafts for every row admitted (those that may emit no more
        tokens are fed along, their drafts dropped)."""
        drafting = [i for i, uid in enumerate(uids) if uid in self.rows]
        found = self.model.drafts(
            [uids[i] for i in drafting], [tokens[i] + [current[i]] for i in drafting], width
        )
        out = []
        for uid, left in zip(uids, remaining):
            row = self.rows.get(uid)
            count = 0 if row is None else max(0, min(width, row.limit, left))
            out.append(found[uid][:count] if count else [])
        return out

    def _synced(self, row: RowDrafts, tokens: list[int]) -> NgramDrafter:
        """The row's index, holding the tokens its KV holds (and, after a speculating step, the
        token read in it, which the batch's list gains at the end of the step)."""
        drafter = row.drafter
        if drafter is None or len(drafter.tokens) > len(tokens) + 1:
            drafter = row.drafter = NgramDrafter(tokens, self.n_min, self.n_max)
        elif len(drafter.tokens) < len(tokens):
            drafter.extend(tokens[len(drafter.tokens) :])
        return drafter
