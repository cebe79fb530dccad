"""Embedding requests on the engine thread. Each job is one request's inputs (token-id rows);
the rows of the jobs waiting are batched by padded tokens, so the other models' streams on the
thread never wait for a whole request. While they stream, each turn is sized by time (the gap
their pacers allow a prefill chunk): an encoder's batch goes through as many of its layers as
fit, over several turns; a decoder's batch is as large as fits, whole."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..embedding.model import EncoderPass
from .states import EmbeddingFailed

EMBEDDING_KINDS = ("embed", "rerank")  # the kinds of model whose jobs these are
# Padded tokens one batch (one engine turn) carries at most; a longer input runs alone
BATCH_TOKENS = 4096
COST_SMOOTHING = 0.3  # weight of a batch's time per padded token in the running mean


@dataclass
class EmbedJob:
    """One request's rows and where its vectors go (a future on the submitter's loop)."""

    rows: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    seconds: list[int] | None = None  # a reranker's pairs: where each row's second text starts
    per_token: bool = False  # each row's hidden states, one vector a token (no pooling)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    taken: int = 0  # rows handed to a batch so far

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.rows)

    def settle(self, result: np.ndarray | None = None, error: str | None = None) -> None:
        def set_it() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(EmbeddingFailed(error))
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(set_it)


class EmbeddingQueue:
    """The jobs of one embedding model, first come first served, row by row."""

    def __init__(self, model, stats=None, batch_tokens: int = BATCH_TOKENS):
        """`stats`: the engine's EngineStats, whose `embedded_inputs` counts the rows done
        (before their requests hear of them)."""
        self.model = model
        self.stats = stats
        self.batch_tokens = batch_tokens
        self.jobs: deque[EmbedJob] = deque()
        # A padded token's time beside streams (batches sized to a budget are small, and a
        # token costs more in them): a decoder's whole pass, an encoder's layer
        self.paced_cost_s: float | None = None
        self.layer_cost_s: float | None = None
        self.current: tuple[list[tuple[EmbedJob, int]], EncoderPass] | None = None

    def __len__(self) -> int:
        return len(self.jobs) + (self.current is not None)

    def add(self, job: EmbedJob) -> None:
        if not job.rows:
            job.settle(np.zeros((0, self.model.dimensions), np.float32))
            return
        self.jobs.append(job)

    def fail_all(self, message: str) -> None:
        while self.jobs:
            self.jobs.popleft().settle(error=message)
        self.current = None

    def step(self, budget_s: float | None = None) -> None:
        """The next share of the waiting rows, within `budget_s` seconds where streams wait on
        it (None: a whole batch of the most tokens a batch carries); settle each job whose
        rows are done. An encoder's batch may go through its layers over several steps."""
        self.jobs = deque(job for job in self.jobs if not job.future.done())  # gone clients
        if self.current is None:
            batch = self._next_batch(self._tokens_within(budget_s))
            if not batch:
                return
            if not self.model.layers:
                self._run_whole(batch, budget_s)
                return
            try:
                part = self.model.begin([job.rows[i] for job, i in batch], _seconds_of(batch))
            except Exception as error:  # one request's failure is its own
                self._fail(batch, error)
                return
            self.current = (batch, part)
        batch, part = self.current
        padded = _padded(batch)
        count = self.model.layers - part.done
        if _bounded(budget_s) and self.layer_cost_s:
            count = max(1, min(count, int(budget_s / (padded * self.layer_cost_s))))
        elif _bounded(budget_s):
            count = 1  # not timed yet beside streams: one layer, then it is
        started = time.perf_counter()
        try:
            self.model.advance(part, count)
            mx.eval(part.x)
            if _bounded(budget_s):
                cost = (time.perf_counter() - started) / (padded * count)
                self.layer_cost_s = _smoothed(self.layer_cost_s, cost)
            if part.done < self.model.layers:
                return
            out = self.model.finish(part, batch[0][0].per_token)
            mx.eval(out)
            values = np.asarray(out)
        except Exception as error:
            self.current = None
            self._fail(batch, error)
            return
        self.current = None
        self._settle(batch, values)

    def _run_whole(self, batch: list[tuple[EmbedJob, int]], budget_s: float | None) -> None:
        """A decoder's batch, in one pass."""
        started = time.perf_counter()
        try:
            rows = [job.rows[i] for job, i in batch]
            if batch[0][0].per_token:
                vectors = self.model.token_states(rows)
            else:
                vectors = self.model.embed(rows, _seconds_of(batch))
            mx.eval(vectors)
            values = np.asarray(vectors)
        except Exception as error:  # one request's failure is its own
            self._fail(batch, error)
            return
        if _bounded(budget_s):
            cost = (time.perf_counter() - started) / _padded(batch)
            self.paced_cost_s = _smoothed(self.paced_cost_s, cost)
        self._settle(batch, values)

    def _settle(self, batch: list[tuple[EmbedJob, int]], values: np.ndarray) -> None:
        for (job, i), vector in zip(batch, values):
            job.vectors[i] = vector[: len(job.rows[i])] if job.per_token else vector
        if self.stats is not None:
            self.stats.embedded_inputs += len(batch)
        while self.jobs and all(v is not None for v in self.jobs[0].vectors):
            job = self.jobs.popleft()
            job.settle(job.vectors if job.per_token else np.stack(job.vectors))

    def _fail(self, batch: list[tuple[EmbedJob, int]], error: Exception) -> None:
        failed = {id(job): job for job, _ in batch}
        for job in failed.values():
            job.settle(error=f"embedding failed: {error}")
        self.jobs = deque(job for job in self.jobs if id(job) not in failed)

    def _tokens_within(self, budget_s: float | None) -> int:
        """The padded tokens a batch may hold: all it may while nothing streams; else what one
        layer (an encoder's) or the whole pass (a decoder's) runs within the budget at what
        paced batches have cost a token; one row until one has been timed (a large batch's
        cost a token is a small one's underestimate)."""
        if not _bounded(budget_s):
            return self.batch_tokens
        cost = self.layer_cost_s if self.model.layers else self.paced_cost_s
        if cost is None or cost <= 0:
            return 1
        return max(1, min(self.batch_tokens, int(budget_s / cost)))

    def _next_batch(self, most: int) -> list[tuple[EmbedJob, int]]:
        """Rows in order of arrival while the batch, padded to its longest row, holds at most
        `most` tokens (the first row goes, however long), all pooled or all per token."""
        batch: list[tuple[EmbedJob, int]] = []
        longest = 0
        for job in self.jobs:
            if batch and job.per_token != batch[0][0].per_token:
                return batch
            while job.taken < len(job.rows):
                length = max(longest, len(job.rows[job.taken]))
                if batch and length * (len(batch) + 1) > most:
                    return batch
                batch.append((job, job.taken))
                longest = length
                job.taken += 1
        return batch


def _bounded(budget_s: float | None) -> bool:
    return budget_s is not None and math.isfinite(budget_s)


def _smoothed(before: float | None, value: float) -> float:
    return value if before is None else before + COST_SMOOTHING * (value - before)


def _seconds_of(batch: list[tuple[EmbedJob, int]]) -> list[int] | None:
    """Where each row's second text starts (a reranker's pairs), or None."""
    if all(job.seconds is None for job, _ in batch):
        return None
    return [job.seconds[i] if job.seconds else len(job.rows[i]) for job, i in batch]


def _padded(batch: list[tuple[EmbedJob, int]]) -> int:
    return len(batch) * max(len(job.rows[i]) for job, i in batch)
