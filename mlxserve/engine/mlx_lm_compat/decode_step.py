"""mlx-lm's `GenerationBatch._step` with the batch's tokens drawn by `sampling.batched.draw`:
mlx-lm calls each row's sampler on its own row unless every row has the same sampler object,
and each of ours is its sequence's own (its seed, its guard).

Everything else is as mlx-lm does it: the forward pass, each row's logits processors on its
row, the next tokens evaluated asynchronously while the current ones are read.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from ...sampling.batched import draw


def _step(self):
    self._current_tokens = self._next_tokens
    self._current_logprobs = self._next_logprobs
    inputs = self._current_tokens

    logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]

    token_context = []
    if any(self.logits_processors):
        rows = []
        for e, processors in enumerate(self.logits_processors):
            row = logits[e : e + 1]
            if processors:  # only rows with processors keep a context
                context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                token_context.append(context)
                for processor in processors:
                    row = processor(context, row)
            rows.append(row)
        logits = mx.concatenate(rows, axis=0)

    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    samplers = [self.fallback_sampler if s is None else s for s in self.samplers]
    self._next_tokens = draw(samplers, logprobs)
    self._next_logprobs = list(logprobs)
    mx.async_eval(self._next_tokens, self._next_logprobs, token_context)

    mx.eval(inputs, self._current_logprobs)
    inputs = inputs.tolist()
    for tokens, token in zip(self.tokens, inputs):
        tokens.append(token)
    return inputs, self._current_logprobs


def install() -> None:
    """Swap the step into mlx-lm's class (idempotent)."""
    GenerationBatch._step = _step
