"""What every encoder family shares: the facts the server reads off its config, the additive
padding mask its layers read, and the activations configs name."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

MASKED = -1e9  # a padded key's additive score: softmax gives it nothing


@dataclass(frozen=True)
class EncoderFacts:
    hidden_size: int  # an embedding's dimensions
    max_tokens: int  # the most tokens an input may have (its positions)
    pad_id: int  # the id right-padded rows are filled with


class LayeredEncoder(nn.Module):
    """An encoder whose layers run one at a time (a batch may go through them over several
    engine turns): a family gives `blocks` and `begin` (ids -> the first layer's input and what
    the layers read besides), and its own `run` (one layer) and `end` where the defaults do not
    serve; the whole pass is theirs in order."""

    def __call__(self, ids: mx.array, mask: mx.array, types: mx.array | None = None) -> mx.array:
        x, masks = self.begin(ids, mask, types)
        for index in range(len(self.blocks)):
            x = self.run(index, x, masks)
        return self.end(x)

    def run(self, index: int, x: mx.array, masks) -> mx.array:
        """Layer `index` over the batch (a family whose layers read other masks says how)."""
        return self.blocks[index](x, masks)

    def end(self, x: mx.array) -> mx.array:
        """The last layer's output is the hidden states (a family with a final norm applies
        it here)."""
        return x


def padding_mask(mask: mx.array, dtype) -> mx.array:
    """(B, L) booleans (a real token) -> (B, 1, 1, L) additive scores every query adds."""
    return mx.where(mask[:, None, None, :], 0.0, MASKED).astype(dtype)


def gelu_tanh(x: mx.array) -> mx.array:
    return nn.gelu_approx(x)


ACTIVATIONS = {
    "gelu": nn.gelu,
    "gelu_new": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
    "sigmoid": mx.sigmoid,
}


def activation(name: str):
    """The activation a config names, or a ValueError naming it."""
    if name not in ACTIVATIONS:
        raise ValueError(f"its activation {name!r} is not one this server runs")
    return ACTIVATIONS[name]
