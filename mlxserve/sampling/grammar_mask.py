"""The grammar as a logits processor: only tokens the grammar allows next keep their logits.

llguidance computes the next token mask on the CPU (tens of microseconds) while the device runs
the forward pass: the processor starts the logits' evaluation first, then feeds the matcher the
token sampled last step and fills the mask, then applies it with one `mx.where`.

A verify pass (speculative decoding) asks it first which drafts the grammar allows, or which
tokens it forces (llguidance's fast-forward tokens) where none were found, and the mask at
each drafted position (`drafted`).
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
        only_eos = np.zeros(self.bitmask.shape[1] * 32, dtype=bool)
        only_eos[list(eos_ids)] = True
        self.only_eos = mx.array(only_eos[:vocab_size])
        self.only_eos_words = np.packbits(only_eos, bitorder="little").view(np.int32)
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward pass runs while the mask is computed below
        if len(tokens) > self.consumed:
            self._consume(tokens[self.consumed :].tolist())
        if self.failed or self.matcher.is_stopped():
            return mx.where(self.only_eos[: logits.shape[-1]], logits, -mx.inf)
        fill_next_token_bitmask(self.matcher, self.bitmask)
        allowed = mx.array(self._unpacked(self.bitmask)[0, : logits.shape[-1]])
        return mx.where(allowed, logits, -mx.inf)

    def drafted(
        self, unseen: list[int], current: int, drafts: list[int], most: int
    ) -> tuple[list[int], mx.array | None, int]:
        """For a verify pass after the row's tokens (`unseen`: those the mask has not been
        called with) and `current` (the pass's first token): the leading `drafts` the grammar
        allows, or the tokens it forces where `drafts` do not start with them (those are kept
        whatever the model says), at most `most`; the mask after each, (drafts, vocabulary)
        booleans; and how many of the drafts lead as the grammar's forced tokens. The matcher
        is left after `unseen`."""
        self._consume(unseen)
        matcher = self.matcher
        if self.failed or matcher.is_stopped() or matcher.try_consume_tokens([current]) != 1:
            return [], None, 0
        forced = matcher.compute_ff_tokens()
        candidates = (forced if drafts[: len(forced)] != forced else drafts)[:most]
        kept: list[int] = []
        masks = allocate_token_bitmask(max(1, len(candidates)), self.bitmask.shape[1] * 32)
        for token in candidates:
            if matcher.is_stopped() or matcher.try_consume_tokens([token]) != 1:
                break
            if matcher.is_stopped():
                masks[len(kept)] = self.only_eos_words
            else:
                fill_next_token_bitmask(matcher, masks, len(kept))
            kept.append(token)
        matcher.rollback(1 + len(kept))
        if not kept:
            return [], None, 0
        masks = mx.array(self._unpacked(masks[: len(kept)])[:, : self.only_eos.size])
        return kept, masks, min(len(forced), len(kept))

    def _consume(self, tokens: list[int]) -> None:
        self.consumed += len(tokens)
        if tokens and not (self.failed or self.matcher.is_stopped()):
            if not self.matcher.consume_tokens(tokens):
                self._fail(tokens)

    @staticmethod
    def _unpacked(bitmask: np.ndarray) -> np.ndarray:
        """(rows, 32 x words) booleans of a packed llguidance bitmask."""
        return np.unpackbits(bitmask.view(np.uint8), axis=-1, bitorder="little").astype(bool)

    def _fail(self, tokens: list[int]) -> None:
        """Never expected (the mask allows only what the matcher accepts): end the sequence."""
        log.error("grammar rejected tokens %s: %s", tokens, self.matcher.get_error())
        self.failed = True
