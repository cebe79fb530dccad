"""Everything that exists only for MLX's CPU backend (OpenBLAS, float32 weights, vectorised
attention, pass sizes, malloc), behind one policy object; `MLXSERVE_PORTABLE=1` turns it off."""

from .blas import cpu_environment, flush_denormals, openblas_library, reexec_for_cpu
from .policy import PORTABLE_ENV, PlatformPolicy, current_policy, portable

__all__ = [
    "PORTABLE_ENV",
    "PlatformPolicy",
    "cpu_environment",
    "current_policy",
    "flush_denormals",
    "openblas_library",
    "portable",
    "reexec_for_cpu",
]
