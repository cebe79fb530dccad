"""Prefill pacing: how many prompt tokens to prefill between two decode steps.

A running stream waits for every prefill chunk run beside it, so a chunk's time bounds that
stream's worst gap between tokens. A fixed chunk cannot keep that bound: a prompt token costs
more the deeper into a long prompt it sits (it attends to everything before it), and a decode step
costs more as the batch grows. So the chunk is sized step by step from what the engine just
measured, and while nothing is decoding no one waits: prompts are then prefilled in the largest
chunks.

Each engine step times mlx-lm's `BatchGenerator.next()` as a whole: mlx-lm pipelines a decode
step's compute into the next call, so its own split of decode and prompt time is not reliable
while both run. A step that only decodes gives the usual gap; a step that also prefills gives that
gap plus the chunk's cost, hence the cost of a prompt token at the current depth.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from ...settings import DEFAULT_MAX_STREAM_GAP

# The share of the bound's room above one decode step that a chunk is planned to take: the
# stray slow steps of a busy machine take the rest (benchmarks/prefill_beside_streams.py
# measures it).
GAP_MARGIN = 0.6
# Beside other models' streams only (thread.py), the share of the bound's room a chunk takes: their
# usual gap is a round of several models' steps, whose stray slow steps vary less against it
# (benchmarks/two_models.py measures both sides).
OTHERS_MARGIN = 0.8
# Deep in a long prompt on a CPU the bound allows a token or two a step; on a GPU far more.
MIN_CHUNK, MAX_CHUNK = 1, 2048
GRANULE = 8  # chunks of GRANULE tokens or more are a multiple of it
# The usual gap is the median of the latest decode-only steps: a mean takes in one slow step, a
# prompt token then looks cheap and the next chunks come out too long.
DECODE_WINDOW = 9
# Beside decoding, a chunk is at most this many times the one just measured: the cost of a prompt
# token is an estimate from one step, and a step that over-runs is a gap a stream waits through.
MAX_GROWTH = 2
# A prompt token's cost is the median of the latest few steps' estimates: steps doing the same
# work vary, and the highest estimate alone makes chunks so small that each step's fixed cost of
# carrying one eats the budget.
COST_WINDOW = 3
# Where fewer than SPREAD_CHUNK tokens fit a step, a chunk goes through the layers over several
# steps, some layers each (`mixed_batch`): deep in a long prompt a token's attention reads its
# whole KV, and more tokens share that read.
# A spread chunk goes through at least this share of the layers a step, whatever the budget says:
# the usual gap is measured before the chunks start and goes stale while they run, so a stream
# that deepens meanwhile would spend the budget on its own attention and starve the prompt.
MIN_LAYER_SHARE = 0.1
# A spread chunk is at least this wide, and a multiple of it: a forward pass's matmuls cost
# about as much for a few rows as for this many (measured at 9ae4df5: docs/benchmarks.md, past
# experiments), so a narrower chunk pays that for fewer tokens. A spread chunk is as wide as the
# budget allows over its passes.
SPREAD_CHUNK = 16


def chunk_cost(max_stream_gap: float | None) -> float:
    """Decode steps' time a prefill chunk may take beside streams, for a gap bound of
    `max_stream_gap` times the usual gap (None: no bound)."""
    if max_stream_gap is None:
        return math.inf
    return (max_stream_gap - 1) * GAP_MARGIN


CHUNK_COST_IN_DECODE_STEPS = chunk_cost(DEFAULT_MAX_STREAM_GAP)


def spare_the_join(chunk: int, tails: list[int]) -> int:
    """`chunk`, cut so that a prompt's final chunk is a single token. The step a prompt joins
    the decode batch in computes its last token besides its final chunk (in the decode pass with
    mixed batches, else in a forward pass of mlx-lm's own): with a full chunk there, the join
    was a running stream's worst gap. `tails`: each prompt's tokens still to prefill before its
    last one."""
    for tail in tails:
        if 1 < tail <= chunk:
            chunk = tail - 1
    return chunk


def even_share(layers: int, share: int) -> int:
    """At most `share` layers a pass, in as few passes, as even as they go: 28 layers and then
    2 make every other step the costliest one could be; 15 and 15 take as many steps."""
    passes = math.ceil(layers / share)
    return math.ceil(layers / passes)


def clamp_chunk(tokens: float) -> int:
    tokens = min(tokens, MAX_CHUNK)
    whole = int(tokens) if tokens < GRANULE else int(tokens) // GRANULE * GRANULE
    return max(MIN_CHUNK, min(MAX_CHUNK, whole))


@dataclass
class PrefillPacer:
    calibrated: int  # the chunk measured at load (`model_host.measure_prefill_chunk`)
    # A forward pass's cost before its tokens: about a decode step (one timed at load, until
    # this engine's own decode steps are measured)
    pass_s: float | None = None
    cost: float = CHUNK_COST_IN_DECODE_STEPS  # a chunk's time beside decoding, in decode steps
    chunk: int = MAX_CHUNK  # the next step's prefill chunk, per prompt being prefilled
    decode_step_s: float | None = None  # the usual decode-only step (median of the latest)
    token_cost_s: float | None = None  # one prompt token's cost at the latest depth (median)
    # The longest chunk beside decoding: a decode step's forward pass carries at most this many
    # prompt tokens (`mixed_batch`); a longer chunk would cost a pass of its own.
    beside_decode_max: int = MAX_CHUNK
    # The model's layers where a chunk may go through them over several steps (`mixed_batch`;
    # 0: it may not), and how many the next chunk goes through a step (None: all)
    layers: int = 0
    layers_per_pass: int | None = None
    _decode_steps: deque = field(default_factory=lambda: deque(maxlen=DECODE_WINDOW))
    _token_costs: deque = field(default_factory=lambda: deque(maxlen=COST_WINDOW))

    def observe(
        self,
        step_s: float,
        prompt_tokens: int,
        prompts: int,
        decoded: bool,
        others_s: float = 0.0,
    ) -> int:
        """Record a step: its wall time, the prompt tokens and prompts it prefilled, whether it
        decoded. `others_s`: how long other models' streams already wait for their own steps
        each round (thread.py). Their usual gap is a round of every busy model's decode step,
        this one's included (its prompts decode next): a chunk may add the bound's share of
        that round, as beside its own streams. Returns the chunk for the next step."""
        if decoded and not prompt_tokens:
            self._decode_steps.append(step_s)
            self.decode_step_s = statistics.median(self._decode_steps)
        elif prompt_tokens:
            # beside decoding, the decode pass; alone, a pass of its own costs about as much
            # for a token as a decode step: either way a prompt token costs what it adds
            usual = (self.decode_step_s if decoded else self._pass_s()) or 0.0
            self._token_costs.append(max(step_s - usual, 1e-6) / prompt_tokens)
            self.token_cost_s = statistics.median(self._token_costs)
        self.layers_per_pass = None
        own_s = self.decode_step_s if decoded else self._pass_s()
        if not decoded and not others_s:
            self.chunk = MAX_CHUNK  # no stream waits on this step
        elif (decoded and own_s is None) or self.token_cost_s is None:
            self.chunk = clamp_chunk(self.calibrated * self.cost / CHUNK_COST_IN_DECODE_STEPS)
        else:
            cost = self.cost if decoded else self.cost / GAP_MARGIN * OTHERS_MARGIN
            budget = cost * (own_s + others_s)
            fits = budget / (self.token_cost_s * max(prompts, 1))  # tokens a step, per prompt
            if prompt_tokens:
                fits = min(fits, max(GRANULE, MAX_GROWTH * prompt_tokens / max(prompts, 1)))
            if not decoded:  # a pass that carries a few tokens costs nearly a full one for them
                fits = max(fits, SPREAD_CHUNK)
            chunk = clamp_chunk(fits)
            if not decoded:
                self.chunk = chunk
                return chunk
            if fits < SPREAD_CHUNK and self.layers:
                chunk, self.layers_per_pass = self._spread(fits)
            self.chunk = min(chunk, self.beside_decode_max)
        return self.chunk

    def _pass_s(self) -> float:
        """A pass of its own for one sequence: timed at load, else a decode step."""
        return self.pass_s or self.decode_step_s or 0.0

    def _spread(self, fits: float) -> tuple[int, int | None]:
        """The chunk that carries the most tokens' worth a step within `fits`: a multiple of
        SPREAD_CHUNK wide, over even passes of at least MIN_LAYER_SHARE of the layers (GRANULE
        tokens over the thinnest passes where none fits): (its tokens, its layers a pass). Not
        narrower: deep in a prompt a pass reads the whole KV whatever the chunk's width, so a
        narrow chunk costs more a token than the wide ones its cost was measured on."""
        floor = math.ceil(self.layers * MIN_LAYER_SHARE)
        best, best_rate = (GRANULE, even_share(self.layers, floor)), 0.0
        widths = range(SPREAD_CHUNK, self.beside_decode_max + 1, SPREAD_CHUNK)
        for passes in range(1, self.layers // floor + 1):
            share = even_share(self.layers, math.ceil(self.layers / passes))
            for width in widths:
                rate = width * share / self.layers
                if best_rate < rate <= fits:
                    best, best_rate = (width, share), rate
        chunk, share = best
        return chunk, share if share < self.layers else None
