"""What a test may expect of MLX's numbers on the device it runs on.

MLX's CPU backend gives a row of a batch the same logits whatever its batch mates. Its GPU
backends pick kernels by shape (one row, or a tile of several), so on a GPU a batch mate moves a
row's logits in their last digits, and a random model's flat distribution turns that into a
different sample some tokens later. A test of "the same alone as in a batch" is exact on the CPU,
within `LOGPROB_TOLERANCE` on a GPU, and for sampled text runs where the CPU backend is in use.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

BATCH_INVARIANT = mx.default_device() == mx.cpu
LOGPROB_TOLERANCE = 1e-4 if BATCH_INVARIANT else 5e-3

needs_batch_invariance = pytest.mark.skipif(
    not BATCH_INVARIANT,
    reason="sampled text alone vs in a batch: exact only where MLX's kernels are batch-invariant "
    "(its CPU backend; this run is on a GPU)",
)


def skip_without_quantized_attention(head_dim: int, bits: int, group_size: int) -> None:
    """Skip where MLX on this device has no quantized attention for these shapes (its CUDA
    backend lacks some); `--kv-bits` then refuses the model at load, saying so."""
    from mlxserve.engine.mlx_lm_compat.quantized_kv import backend_refusal

    refusal = backend_refusal(head_dim, bits, group_size)
    if refusal:
        pytest.skip(f"no quantized attention for heads of {head_dim} on this device: {refusal}")
