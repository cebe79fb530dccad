"""The engine's counters, read by /metrics, /admin/status and the menubar."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

RATE_WINDOW_S = 5.0


@dataclass
class EngineStats:
    decode_steps: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    finished_sequences: int = 0
    cancelled_sequences: int = 0
    failed_sequences: int = 0  # ended alone by a failure in their row (failures/row_guard.py)
    active_sequences: int = 0
    peak_batch: int = 0
    waiting_groups: int = 0
    prefix_lookups: int = 0
    prefix_hits: int = 0
    prefix_reused_tokens: int = 0
    prefix_cache_bytes: int = 0
    prefix_disk_entries: int = 0  # this model's files in the prefix cache's folder
    prefix_disk_loads: int = 0  # prompts started from one of them
    drafted_tokens: int = 0  # prompt-lookup drafts verified (speculation/)
    accepted_tokens: int = 0  # of them, kept
    embedded_inputs: int = 0  # an embedding model's inputs embedded (embedding_jobs.py)
    tokens_per_second: float = 0.0  # generated, over the last RATE_WINDOW_S seconds


class RateMeter:
    """Generated tokens per second over a sliding window of decode steps."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def record(self, total_generated: int) -> float:
        """Note the running total after a decode step; the rate over the window."""
        now, samples = time.monotonic(), self._samples
        samples.append((now, total_generated))
        while len(samples) > 2 and now - samples[0][0] > self.window_s:
            samples.popleft()
        (start, first), (end, last) = samples[0], samples[-1]
        return (last - first) / (end - start) if end > start else 0.0

    def idle(self) -> bool:
        """Nothing generated within the window."""
        return not self._samples or time.monotonic() - self._samples[-1][0] > self.window_s
