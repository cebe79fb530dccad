"""One row's sampler and logits processors, each call guarded: an exception marks the row failed
and the row gets a harmless stand-in (its logits untouched, a greedy token), so the step runs to
its end and the batch's other rows come out exactly as they would have. The engine then ends the
failed row with an error event naming the cause."""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx

from ...sampling.chain import Ban
from ...sampling.grammar_mask import GrammarMask

log = logging.getLogger("mlxserve.engine")


class RowGuard:
    def __init__(self) -> None:
        self.error: str | None = None  # the first failure, once the row failed
        self.steps = 0  # tokens sampled so far

    def fail(self, stage: str, error: Exception) -> None:
        if self.error is None:
            log.error("a sequence failed in its %s: %r", stage, error, exc_info=error)
            self.error = f"{stage} failed: {type(error).__name__}: {error}"

    @property
    def alone(self) -> bool:
        """Whether the row must be handled on its own, not with rows like it: it failed, and its
        stand-in (logits untouched, a greedy token) is its own."""
        return self.error is not None

    def processor(self, process: Callable, stage: str) -> GuardedProcessor:
        return GuardedProcessor(self, process, stage)

    def sampler(self, sample: Callable) -> GuardedSampler:
        return GuardedSampler(self, sample)


class GuardedProcessor:
    """A row's logits processor behind its guard. A ban of fixed ids gives itself up (`ban`), so
    that rows banning the same ids are banned together, unless this row goes alone."""

    def __init__(self, guard: RowGuard, process: Callable, stage: str):
        self.guard = guard
        self.process = process
        self.stage = stage

    @property
    def ban(self) -> Ban | None:
        if self.guard.alone or not isinstance(self.process, Ban):
            return None
        return self.process

    @property
    def grammar(self) -> GrammarMask | None:
        """The row's grammar, for a verify pass's drafts (none once the row failed)."""
        if self.guard.error is not None or not isinstance(self.process, GrammarMask):
            return None
        return self.process

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        guard = self.guard
        if guard.error is not None:
            return logits
        try:
            return self.process(tokens, logits)
        except Exception as error:
            guard.fail(self.stage, error)
            return logits


class GuardedSampler:
    """A row's sampler behind its guard. Rows drawn together (sampling/batched.py) share a
    `group_key`; a row that failed draws alone."""

    def __init__(self, guard: RowGuard, sample: Callable):
        self.guard = guard
        self.sample = sample

    @property
    def group_key(self):
        return None if self.guard.alone else getattr(self.sample, "group_key", None)

    @property
    def needs_logprobs(self) -> bool:
        return getattr(self.sample, "needs_logprobs", True)

    def __call__(self, logprobs: mx.array) -> mx.array:
        guard = self.guard
        if guard.error is None:
            try:
                token = self.sample(logprobs)
                guard.steps += 1
                return token
            except Exception as error:
                guard.fail("sampler", error)
        return mx.argmax(logprobs, axis=-1)

    @property
    def samples(self) -> bool:
        """Whether it draws at random (not greedy)."""
        params = getattr(self.sample, "params", None)
        return params is not None and not params.greedy

    def drafts_verified(self, logprobs: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
        """Its sampler's speculative sampling over a verify pass; failing, none kept and the
        greedy token at the first position, as a failed draw."""
        guard = self.guard
        if guard.error is None:
            try:
                verified = self.sample.drafts_verified(logprobs, drafts)
                guard.steps += 1
                return verified
            except Exception as error:
                guard.fail("sampler", error)
        return mx.zeros((1,), mx.int32), mx.argmax(logprobs[:1], axis=-1)

    def draw_rows(self, members: list[GuardedSampler], logprobs: mx.array) -> mx.array:
        """The rows of `members` (which share this `group_key`) drawn together; if that fails,
        each on its own, so the guard of the failing row names it."""
        try:
            tokens = self.sample.draw_rows([m.sample for m in members], logprobs)
        except Exception:
            log.debug("a group of %d rows failed to draw together", len(members), exc_info=True)
            return mx.concatenate([m(logprobs[i : i + 1]) for i, m in enumerate(members)])
        for member in members:
            member.guard.steps += 1
        return tokens
