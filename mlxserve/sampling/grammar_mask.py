"""The grammar as a logits processor: only tokens the grammar allows next keep their logits.

llguidance computes the next token mask on the CPU (tens of microseconds) while the device runs
the forward pass: the processor starts the logits' evaluation first, then feeds the matcher the
token sampled last step and fills the mask, then applies it with one `mx.where`.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

log = logging.getLogger(__name__)


class GrammarMask:
    """Per-sequence logits processor holding the sequence's llguidance matcher."""

    def __init__(self, matcher: LLMatcher, prompt_length: int, vocab_size: int, eos_ids: list[int]):
        self.matcher = matcher
        self.consumed = prompt_length  # tokens before this are the prompt, not grammar output
        self.bitmask = allocate_token_bitmask(1, vocab_size)
        only_eos = np.zeros(vocab_size, dtype=bool)
        only_eos[list(eos_ids)] = True
        self.only_eos = mx.array(only_eos)
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward pass runs while the mask is computed below
        if len(tokens) > self.consumed:
            new = tokens[self.consumed :].tolist()
            self.consumed = len(tokens)
            if not (self.failed or self.matcher.is_stopped()):
                if not self.matcher.consume_tokens(new):
                    self._fail(new)
        if self.failed or self.matcher.is_stopped():
            return mx.where(self.only_eos[: logits.shape[-1]], logits, -mx.inf)
        fill_next_token_bitmask(self.matcher, self.bitmask)
        bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")
        allowed = mx.array(bits[: logits.shape[-1]].astype(bool))
        return mx.where(allowed, logits, -mx.inf)

    def _fail(self, tokens: list[int]) -> None:
        """Never expected (the mask allows only what the matcher accepts): end the sequence."""
        log.error("grammar rejected tokens %s: %s", tokens, self.matcher.get_error())
        self.failed = True
