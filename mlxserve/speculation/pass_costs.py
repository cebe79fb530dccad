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

from collections import deque
from statistics import median

WINDOW = 9  # a width's latest step times at a batch size; their median is its time
PRIOR_COST_PER_DRAFT = 0.02  # an unmeasured pass's cost per drafted token, over the plain step
RECOVERY = 0.05  # pull towards `recover`'s aim of each step a batch could have drafted and did not
TRUSTED_SAMPLES = 3  # a width's timings vote on where the others recover once it has this many


def bucket(rows: int) -> int:
    """Batch sizes timed together: the power of two at or above `rows`."""
    return 1 << max(0, rows - 1).bit_length()


class PassCosts:
    """Step times by (batch bucket, width), the median of each one's latest WINDOW (one slow
    step, a pause of the process or the machine, moves no median: a running mean kept one for
    dozens of steps, and a plain step timed 4x its usual made drafting look cheaper than not);
    `relative_cost` is the `choose_width` cost function."""

    def __init__(self) -> None:
        self._samples: dict[tuple[int, int], deque[float]] = {}

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """A decode step of `rows` rows with `width` drafts (0: a plain step), with no prompt
        work in it, took `seconds` start to start."""
        key = (bucket(rows), width)
        self._samples.setdefault(key, deque(maxlen=WINDOW)).append(seconds)

    def recover(self, rows: int) -> None:
        """A step at `rows` rows that had drafts but drafted none: each width timed at that size
        and dearer per draft than the others moves a little towards what they cost a draft, so
        a width once timed slow (a step that waited on something else) is tried again, and
        timed again, some steps later. Widths timed TRUSTED_SAMPLES times vote, and the prior
        too: where no width has been timed that often, all move towards the prior; where every
        width is as dear, none moves (a pull towards the prior alone had a batch of 16 on a
        small model retry passes timed three times dearer than the prior, every few dozen
        steps)."""
        size = bucket(rows)
        plain = self._time(size, 0)
        if plain is None or plain <= 0:
            return
        timed = {
            width: (samples, median(samples))
            for (at, width), samples in self._samples.items()
            if at == size and width
        }
        per_draft = [
            max(0.0, seconds / plain - 1.0) / width
            for width, (samples, seconds) in timed.items()
            if len(samples) >= TRUSTED_SAMPLES
        ]
        target = median([*per_draft, PRIOR_COST_PER_DRAFT * rows])
        for width, (samples, seconds) in timed.items():
            aim = plain * (1.0 + target * width)
            if aim >= seconds:
                continue  # never dearer: a width is made dear only by its own timings
            scale = (seconds + RECOVERY * (aim - seconds)) / seconds
            moved = [t * scale for t in samples]  # every sample alike: the median moves
            samples.clear()
            samples.extend(moved)

    def relative_cost(self, rows: int, width: int) -> float:
        """A step of `width` drafts over the plain step, at `rows` rows (never under 1: a pass
        that carries drafts does all a plain one does)."""
        if width == 0:
            return 1.0
        size = bucket(rows)
        plain, wide = self._time(size, 0), self._time(size, width)
        if plain is None or wide is None or plain <= 0:
            return 1.0 + PRIOR_COST_PER_DRAFT * width * rows
        return max(1.0, wide / plain)

    def measured(self) -> dict[tuple[int, int], float]:
        """(bucket, width): median seconds, for /metrics' and benchmarks' eyes."""
        return {key: median(samples) for key, samples in self._samples.items()}

    def _time(self, size: int, width: int) -> float | None:
        samples = self._samples.get((size, width))
        return median(samples) if samples else None


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
        plain = self._time(size, 0)
        if width == 0 or (size, width) in self._samples or not plain:
            return cost
        below = [w for (at, w) in self._samples if at == size and 0 < w < width]
        if not below:
            return cost
        timed = max(below)
        per_draft = (self._time(size, timed) / plain - 1.0) / timed
        return max(cost, 1.0 + per_draft * width)


class FlatPassCosts(PassCosts):
    """`--spec-fixed-width`: every width costs what a plain step does, so a row drafts all it
    finds (up to its most), as llama.cpp's and vLLM's servers draft, whatever the timings."""

    def relative_cost(self, rows: int, width: int) -> float:
        return 1.0
