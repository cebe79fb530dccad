"""Embedding requests on the engine thread. Each job is one request's inputs (token-id rows);
the rows of the jobs waiting are batched by padded tokens, one batch an engine turn, so the
other models' streams on the thread wait for one batch at most, never a whole request."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .states import EmbeddingFailed

# Padded tokens one batch (one engine turn) carries at most; a longer input runs alone
BATCH_TOKENS = 4096


@dataclass
class EmbedJob:
    """One request's rows and where its vectors go (a future on the submitter's loop)."""

    rows: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
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

    def step(self) -> None:
        """Embed the next batch of waiting rows; settle each job whose rows are all done."""
        self.jobs = deque(job for job in self.jobs if not job.future.done())  # gone clients
        batch = self._next_batch()
        if not batch:
            return
        try:
            vectors = self.model.embed([job.rows[i] for job, i in batch])
            mx.eval(vectors)
            values = np.asarray(vectors)
        except Exception as error:  # one request's failure is its own
            failed = {id(job): job for job, _ in batch}
            for job in failed.values():
                job.settle(error=f"embedding failed: {error}")
            self.jobs = deque(job for job in self.jobs if id(job) not in failed)
            return
        for (job, i), vector in zip(batch, values):
            job.vectors[i] = vector
        self.rows_done += len(batch)
        while self.jobs and all(v is not None for v in self.jobs[0].vectors):
            job = self.jobs.popleft()
            job.settle(np.stack(job.vectors))

    def _next_batch(self) -> list[tuple[EmbedJob, int]]:
        """Rows in order of arrival while the batch, padded to its longest row, fits."""
        batch: list[tuple[EmbedJob, int]] = []
        longest = 0
        for job in self.jobs:
            while job.taken < len(job.rows):
                length = max(longest, len(job.rows[job.taken]))
                if batch and length * (len(batch) + 1) > self.batch_tokens:
                    return batch
                batch.append((job, job.taken))
                longest = length
                job.taken += 1
        return batch
