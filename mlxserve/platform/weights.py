"""Weights as MLX's CPU backend runs them fastest: float32, quantized layers widened.

On the CPU a quantized matmul is MLX's own loop, so a batch costs what its rows cost one by one,
while float32 weights go through BLAS, where a batch shares the reads; half-precision matmuls are
slower than float32 there too. A GPU keeps the model as stored (fast quantized kernels).
docs/benchmarks.md has the measurements.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

log = logging.getLogger("mlxserve.platform")

# A quantized model is widened only while its float32 weights take at most this share of the
# machine's memory: a small model is, a 7B model (28 GB as float32) is not.
DEQUANTIZE_MEMORY_SHARE = 8


def dequantize(model: nn.Module, budget_bytes: int, evaluate=None, lazy: bool = False) -> bool:
    """Widen a quantized `model` to float32 if that fits `budget_bytes`; whether it did.
    `evaluate(model)` computes the widened weights (None: all at once); `lazy`: not yet (a
    tensor split slices them first, so that a rank computes only its share)."""
    from mlx_lm.utils import dequantize_model

    quantized = [m for _, m in model.named_modules() if hasattr(m, "bits") and "scales" in m]
    if not quantized:
        return False
    quantized_elements = sum(m.weight.size * 32 // m.bits for m in quantized)
    packed = sum(m.weight.size for m in quantized)
    others = sum(v.size for _, v in tree_flatten(model.parameters())) - packed
    float_bytes = 4 * (quantized_elements + others)
    if float_bytes > budget_bytes:
        log.info(
            "CPU backend: keeping quantized weights (%.1f GB as float32 is over %.1f GB)",
            float_bytes / 1e9,
            budget_bytes / 1e9,
        )
        return False
    dequantize_model(model)
    model.set_dtype(mx.float32)
    if not lazy:
        (evaluate or (lambda m: mx.eval(m.parameters())))(model)
    log.info(
        "CPU backend: quantized weights widened to float32 (%.2f GB) for batching",
        float_bytes / 1e9,
    )
    return True


def upcast(model: nn.Module) -> bool:
    """Widen half-precision weights and quantization scales to float32; whether any were."""
    half = {mx.float16, mx.bfloat16}
    if not any(v.dtype in half for _, v in tree_flatten(model.parameters())):
        return False
    model.set_dtype(mx.float32, predicate=lambda dtype: dtype in half)
    log.info("CPU backend: half-precision weights widened to float32 for speed")
    return True
