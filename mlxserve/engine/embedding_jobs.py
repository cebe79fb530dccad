"""Embedding requests on the engine thread. Each job is one request's inputs (token-id rows);
the rows of the jobs waiting are batched by padded tokens, one batch an engine turn, so the
other models' streams on the thread wait for one batch at most, never a whole request. While
they stream, a batch is sized by time: the gap their pacers allow a prefill chunk, over what a
padded token has cost here."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

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

    def __init__(self, model, batch_tokens: int = BATCH_TOKENS):
        self.model = model
        self.batch_tokens = batch_tokens
        self.jobs: deque[EmbedJob] = deque()
        self.rows_done = 0  # for stats
        self.token_cost_s: float | None = None  # a padded token's time in a batch (mean)
        # ... in batches sized to a budget: small ones, whose tokens each cost more
        self.paced_cost_s: float | None = None

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: EmbedJob) -> None:
        if not job.rows:
            job.settle(np.zeros((0, self.model.dimensions), np.float32))
            return
        self.jobs.append(job)

    def fail_all(self, message: str) -> None:
        while self.jobs:
            self.jobs.popleft().settle(error=message)

    def step(self, budget_s: float | None = None) -> None:
        """Embed the next batch of waiting rows, within `budget_s` seconds where streams wait
        on it (None: the most tokens a batch carries); settle each job whose rows are done."""
        self.jobs = deque(job for job in self.jobs if not job.future.done())  # gone clients
        batch = self._next_batch(self._tokens_within(budget_s))
        if not batch:
            return
        started = time.perf_counter()
        try:
            seconds = None
            if any(job.seconds is not None for job, _ in batch):
                seconds = [job.seconds[i] if job.seconds else len(job.rows[i]) for job, i in batch]
            rows = [job.rows[i] for job, i in batch]
            if batch[0][0].per_token:
                vectors = self.model.token_states(rows)
            else:
                vectors = self.model.embed(rows, seconds)
            mx.eval(vectors)
            values = np.asarray(vectors)
        except Exception as error:  # one request's failure is its own
            failed = {id(job): job for job, _ in batch}
            for job in failed.values():
                job.settle(error=f"embedding failed: {error}")
            self.jobs = deque(job for job in self.jobs if id(job) not in failed)
            return
        padded = len(batch) * max(len(job.rows[i]) for job, i in batch)
        cost = (time.perf_counter() - started) / padded
        self.token_cost_s = _smoothed(self.token_cost_s, cost)
        if _bounded(budget_s):
            self.paced_cost_s = _smoothed(self.paced_cost_s, cost)
        for (job, i), vector in zip(batch, values):
            job.vectors[i] = vector[: len(job.rows[i])] if job.per_token else vector
        self.rows_done += len(batch)
        while self.jobs and all(v is not None for v in self.jobs[0].vectors):
            job = self.jobs.popleft()
            job.settle(job.vectors if job.per_token else np.stack(job.vectors))

    def _tokens_within(self, budget_s: float | None) -> int:
        """The padded tokens a batch may hold: all it may while nothing streams; within the
        budget at what paced batches have cost a token; one row until one has been timed (a
        large batch's cost a token is a small one's underestimate)."""
        if not _bounded(budget_s):
            return self.batch_tokens
        cost = self.paced_cost_s
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
