"""The one decision: does this process use the CPU backend's tricks, and which.

Asked once when a model loads. Every trick is off on a GPU, and off everywhere when
`MLXSERVE_PORTABLE=1`, so this machine can run the code exactly as a Mac's GPU runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PORTABLE_ENV = "MLXSERVE_PORTABLE"
# A prompt chunk runs as forward passes of at most this many tokens on the CPU: longer passes'
# activations and scores outgrow the caches (docs/benchmarks.md). None: the engine's own.
CPU_PASS_TOKENS = 64


def portable() -> bool:
    """Whether `MLXSERVE_PORTABLE` asks for the code paths a Mac's GPU runs, and nothing else."""
    return os.environ.get(PORTABLE_ENV, "").strip() not in ("", "0")


@dataclass(frozen=True)
class PlatformPolicy:
    """What the engine does differently because MLX runs on the CPU."""

    cpu_tricks: bool = False  # all below: MLX on the CPU and not portable
    prompt_pass_tokens: int | None = None  # a prompt chunk's longest forward pass (None: default)

    @property
    def description(self) -> str:
        if self.cpu_tricks:
            return (
                "CPU backend (float32 weights, vectorised attention, padded matmul rows, "
                "malloc tuning)"
            )
        return "portable (as on a Mac's GPU)" if portable() else "GPU"

    @property
    def converts_weights(self) -> bool:
        """Whether `prepare_model` does anything (a phase of its own in the load's progress)."""
        return self.cpu_tricks

    def prepare_model(self, model, sharded: bool = False, evaluate=None) -> None:
        """The model as this platform runs it best. Sharded quantized layers stay quantized.
        `evaluate(model)`: how converted weights are computed (None: all at once)."""
        if not self.cpu_tricks:
            return
        from ..settings import machine_memory_bytes
        from .attention import use_vectorised_attention
        from .weights import DEQUANTIZE_MEMORY_SHARE, dequantize, upcast

        if not sharded:
            dequantize(model, machine_memory_bytes() // DEQUANTIZE_MEMORY_SHARE, evaluate)
        upcast(model)
        if not sharded:
            use_vectorised_attention(model)

    def widen_before_tensor_split(self, model, ranks: int) -> None:
        """Before a tensor split: quantized weights widened to float32 (lazily: each rank then
        computes its slices alone), as `prepare_model` widens a whole model's, where each
        rank's share fits its budget; a split layer's own quantized kernels are slow here."""
        if not self.cpu_tricks:
            return
        from ..settings import machine_memory_bytes
        from .weights import DEQUANTIZE_MEMORY_SHARE, dequantize

        dequantize(model, ranks * machine_memory_bytes() // DEQUANTIZE_MEMORY_SHARE, lazy=True)

    def attention(self):
        """The attention function forward passes of our own should call (mixed batches)."""
        if self.cpu_tricks:
            from .attention import scaled_dot_product_attention

            return scaled_dot_product_attention
        from mlx_lm.models.base import scaled_dot_product_attention

        return scaled_dot_product_attention

    def matmul_rows(self):
        """How many rows forward passes of our own (mixed batches) should run their matmuls
        with, for a pass of n rows (None: n, as they are)."""
        if self.cpu_tricks:
            from .matmul_rows import padded_rows

            return padded_rows
        return None

    def limit_malloc_arenas(self) -> None:
        if self.cpu_tricks:
            from .memory import limit_malloc_arenas

            limit_malloc_arenas()

    def release_freed_memory(self, trim: bool = True, clear_cache: bool = True) -> None:
        """MLX's cache of freed buffers back to the system (`clear_cache`), and (`trim`, CPU)
        malloc's pages."""
        from .memory import release_freed_memory

        release_freed_memory(trim=trim and self.cpu_tricks, clear_cache=clear_cache)


def current_policy() -> PlatformPolicy:
    """The policy for MLX's default device in this process."""
    import mlx.core as mx

    if mx.default_device() != mx.cpu or portable():
        return PlatformPolicy()
    return PlatformPolicy(cpu_tricks=True, prompt_pass_tokens=CPU_PASS_TOKENS)
