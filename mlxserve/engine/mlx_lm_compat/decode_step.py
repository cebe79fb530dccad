"""mlx-lm's `GenerationBatch._step` with the batch's tokens drawn by `sampling.batched.draw`:
mlx-lm calls each row's sampler on its own row unless every row has the same sampler object,
and each of ours is its sequence's own (its seed, its guard).

Rows that ban the same token ids (EOS under ignore_eos) are banned in one op too, and a step
whose rows are all greedy and report no logprobs skips normalising the logits. Everything else
is as mlx-lm does it: the forward pass, each row's other logits processors on its row, the next
tokens evaluated asynchronously while the current ones are read.

Where the batch has a draft planner and no prompt work in the step, the step may instead verify
drafted tokens (`speculative_step`).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from ...sampling.batched import draw
from ...sampling.chain import banned_at_rows, shared_bans
from . import speculative_step


def _step(self):
    planner = getattr(self, "planner", None)
    if planner is not None and getattr(self, "may_draft", False):
        drafts = speculative_step.planned_drafts(self, planner)
        if drafts is not None:
            return speculative_step.verify_step(
                self, planner, drafts, lambda logits, inputs: _processed(self, logits, inputs)
            )
    self.draft_width = 0
    self._current_tokens = self._next_tokens
    self._current_logprobs = self._next_logprobs
    inputs = self._current_tokens

    logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
    logits, token_context = _processed(self, logits, inputs)

    samplers = [self.fallback_sampler if s is None else s for s in self.samplers]
    if any(getattr(s, "needs_logprobs", True) for s in samplers):
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    else:  # every row takes its argmax and reports no logprobs: no exp over the vocabulary
        logprobs = logits
    self._next_tokens = draw(samplers, logprobs)
    self._next_logprobs = list(logprobs)
    mx.async_eval(self._next_tokens, self._next_logprobs, token_context)

    mx.eval(inputs, self._current_logprobs)
    inputs = inputs.tolist()
    for tokens, token in zip(self.tokens, inputs):
        tokens.append(token)
    return inputs, self._current_logprobs


def _processed(self, logits: mx.array, inputs: mx.array) -> tuple[mx.array, list]:
    """`logits` (B, V) through each row's logits processors, `inputs` (B,) added to the token
    context of each row that has some; and those contexts."""
    token_context = []
    if any(self.logits_processors):
        bans, own = shared_bans(self.logits_processors)  # each ban on all its rows at once
        logits = banned_at_rows(logits, bans)
        if any(own):
            rows = []
            for e, processors in enumerate(own):
                row = logits[e : e + 1]
                if processors:  # only rows with processors keep a context
                    context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                    token_context.append(context)
                    for processor in processors:
                        row = processor(context, row)
                rows.append(row)
            logits = mx.concatenate(rows, axis=0)
    return logits, token_context


def install() -> None:
    """Swap the step, and `next` for steps that emit several tokens a row, into mlx-lm's class
    (idempotent)."""
    GenerationBatch._step = _step
    GenerationBatch.next = speculative_step.next_responses
