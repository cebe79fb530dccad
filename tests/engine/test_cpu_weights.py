"""On MLX's CPU backend the server widens weights to float32 where memory allows: quantized
matmuls there cost as much per sequence in a batch as alone, so batching needs float weights."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from mlxserve.platform.weights import dequantize

pytestmark = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="Metal keeps quantized weights"
)


def quantized_tiny(path):
    model, _ = mlx_lm.load(str(path))
    nn.quantize(model, group_size=32, bits=4)
    return model


def quantized_layers(model) -> int:
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding)
    return sum(isinstance(m, kinds) for _, m in model.named_modules())


def test_a_quantized_model_is_dequantized_with_the_same_logits(tiny_model):
    model = quantized_tiny(tiny_model)
    tokens = mx.array([[5, 17, 300, 42, 7, 99]])
    before = model(tokens)
    assert quantized_layers(model) > 0
    assert dequantize(model, budget_bytes=1 << 30)
    assert quantized_layers(model) == 0
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(model.parameters()))
    assert mx.allclose(model(tokens), before, atol=1e-4).item()


def test_a_model_over_the_budget_stays_quantized(tiny_model):
    model = quantized_tiny(tiny_model)
    assert not dequantize(model, budget_bytes=1000)
    assert quantized_layers(model) > 0
