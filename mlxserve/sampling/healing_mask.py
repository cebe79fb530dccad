"""Token healing's logits processor, on the device (the healing itself, planned in the front
process, is `token_healing.py`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .token_healing import TokenTexts


class HealingMask:
    """Logits processor: until the healed text is written again, only tokens that continue it
    keep their logits (EOS and the FIM end tokens never do)."""

    def __init__(self, text: str, texts: TokenTexts, prompt_length: int):
        self.rest = text
        self.texts = texts
        self.consumed = prompt_length

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if not self.rest:
            return logits
        if len(tokens) > self.consumed:
            for token in tokens[self.consumed :].tolist():
                written = self.texts.text(token)
                self.rest = self.rest[len(written) :] if self.rest.startswith(written) else ""
            self.consumed = len(tokens)
        if not self.rest:
            return logits
        allowed = np.zeros(logits.shape[-1], dtype=bool)
        allowed[self.texts.continuing(self.rest)] = True
        return mx.where(mx.array(allowed), logits, -mx.inf)
