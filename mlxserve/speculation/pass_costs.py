"""What a verify pass of a given width costs against a plain decode step, measured while serving.

The cost depends on the device (a GPU reads the weights once for a few more tokens; a CPU pays
for each), the model and the batch's size, so it is learnt from the engine's own steps: the
time from one step's start to the next, which counts what a speculating step loses by waiting
for its tokens before the next pass, as well as its longer pass. Until a width has been timed
at a batch size, a prior that grows with the drafted tokens the whole pass carries (rows x
width) stands in: a lone row tries wide passes at once, a full batch only for rows that are
nearly always right (a wide pass over a large batch is compute-bound, and trying it costs every
row a slow step).
"""

from __future__ import annotations

SMOOTHING = 0.2  # weight of a new step's time in the running mean
PRIOR_COST_PER_DRAFT = 0.02  # an unmeasured pass's cost per drafted token, over the plain step
RECOVERY = 0.05  # pull towards the prior of each step a batch could have drafted and did not


def bucket(rows: int) -> int:
    """Batch sizes timed together: the power of two at or above `rows`."""
    return 1 << max(0, rows - 1).bit_length()


class PassCosts:
    """Running mean step time by (batch bucket, width); `relative_cost` is the `choose_width`
    cost function."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[int, int], float] = {}

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """A decode step of `rows` rows with `width` drafts (0: a plain step), with no prompt
        work in it, took `seconds` start to start."""
        key = (bucket(rows), width)
        before = self._seconds.get(key)
        self._seconds[key] = (
            seconds if before is None else (1 - SMOOTHING) * before + SMOOTHING * seconds
        )

    def recover(self, rows: int) -> None:
        """A step at `rows` rows that had drafts but drafted none: each width timed at that size
        moves a little towards its prior, so a width once timed slow (a step that waited on
        something else) is tried again, and timed again, some steps later."""
        size = bucket(rows)
        plain = self._seconds.get((size, 0))
        if plain is None or plain <= 0:
            return
        for (at, width), seconds in self._seconds.items():
            if at == size and width:
                prior = plain * (1.0 + PRIOR_COST_PER_DRAFT * width * rows)
                self._seconds[at, width] = seconds + RECOVERY * (prior - seconds)

    def relative_cost(self, rows: int, width: int) -> float:
        """A step of `width` drafts over the plain step, at `rows` rows."""
        if width == 0:
            return 1.0
        size = bucket(rows)
        plain, wide = self._seconds.get((size, 0)), self._seconds.get((size, width))
        if plain is None or wide is None or plain <= 0:
            return 1.0 + PRIOR_COST_PER_DRAFT * width * rows
        return wide / plain

    def measured(self) -> dict[tuple[int, int], float]:
        """(bucket, width): mean seconds, for /metrics' and benchmarks' eyes."""
        return dict(self._seconds)


class DraftModelPassCosts(PassCosts):
    """A draft model's pass costs: each drafted token is a pass of the draft model too, which
    the prior (a wider pass of the model alone) does not count. So a width not yet timed costs
    at least what the widest timed one below it costs a draft, and timed widths stay as timed
    (no drift back to the prior: what made them slow is the draft model, every time)."""

    def recover(self, rows: int) -> None:
        return

    def relative_cost(self, rows: int, width: int) -> float:
        cost = super().relative_cost(rows, width)
        size = bucket(rows)
        plain = self._seconds.get((size, 0))
        if width == 0 or (size, width) in self._seconds or not plain:
            return cost
        below = [w for (at, w) in self._seconds if at == size and 0 < w < width]
        if not below:
            return cost
        timed = max(below)
        per_draft = (self._seconds[size, timed] / plain - 1.0) / timed
        return max(cost, 1.0 + per_draft * width)


class FlatPassCosts(PassCosts):
    """`--spec-fixed-width`: every width costs what a plain step does, so a row drafts all it
    finds (up to its most), as llama.cpp's and vLLM's servers draft, whatever the timings."""

    def relative_cost(self, rows: int, width: int) -> float:
        return 1.0
