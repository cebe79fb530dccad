"""One row's sampler and logits processors, each call guarded: an exception marks the row failed
and the row gets a harmless stand-in (its logits untouched, a greedy token), so the step runs to
its end and the batch's other rows come out exactly as they would have. The engine then ends the
failed row with an error event naming the cause."""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx

from .faults import Fault

log = logging.getLogger("mlxserve.engine")


class RowGuard:
    def __init__(self, fault: Fault | None = None):
        self.fault = fault
        self.error: str | None = None  # the first failure, once the row failed
        self.steps = 0  # tokens sampled so far

    def fail(self, stage: str, error: Exception) -> None:
        if self.error is None:
            log.error("a sequence failed in its %s: %r", stage, error, exc_info=error)
            self.error = f"{stage} failed: {type(error).__name__}: {error}"

    def processor(self, process: Callable, stage: str) -> Callable:
        def guarded(tokens, logits):
            if self.error is not None:
                return logits
            try:
                if self.fault is not None:
                    self.fault.check(stage, self.steps)
                return process(tokens, logits)
            except Exception as error:
                self.fail(stage, error)
                return logits

        return guarded

    def sampler(self, sample: Callable) -> Callable:
        def guarded(logprobs):
            if self.error is None:
                try:
                    if self.fault is not None:
                        self.fault.check("sampler", self.steps)
                    token = sample(logprobs)
                    self.steps += 1
                    return token
                except Exception as error:
                    self.fail("sampler", error)
            return mx.argmax(logprobs, axis=-1)

        return guarded
