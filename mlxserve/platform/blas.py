"""Linux: run MLX's CPU backend on OpenBLAS when the machine has it, with huge pages.

MLX's Linux CPU wheel links a reference BLAS; Debian's OpenBLAS preloaded in its place makes
matrix products an order of magnitude faster, and with them float32 batched decoding
(`weights.py`). A preload only works from process start, so the process re-executes
itself once with LD_PRELOAD set. macOS (Metal, Accelerate) is never touched.
`MLXSERVE_NO_OPENBLAS=1` opts out; `MLXSERVE_PORTABLE=1` (policy.py) skips the re-execution.
Without OpenBLAS the server starts with a warning (`slow_blas_reason`).

MLX's CPU backend has no buffer cache: every array is a fresh malloc, and an array of some MB is
fresh pages, and page faults dominated copying a long prompt's KV into the running batch. glibc
asks for transparent huge pages instead (`glibc.malloc.hugetlb=1`, read only at process start,
hence the same re-execution).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from .policy import portable

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",  # apt: libopenblas0-pthread
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)

INSTALL_OPENBLAS = (
    "sudo apt-get install libopenblas0-pthread (or scripts/install_system_packages.sh)"
)


def openblas_library() -> str | None:
    if sys.platform != "linux" or os.environ.get("MLXSERVE_NO_OPENBLAS"):
        return None
    return _installed_openblas()


def _installed_openblas() -> str | None:
    return next((path for path in OPENBLAS_CANDIDATES if os.path.exists(path)), None)


def slow_blas_reason() -> str | None:
    """Why MLX's CPU backend in this process runs on the reference BLAS of MLX's Linux wheel
    (prompts ran at 3.5 tokens/s, prefill chunks of 1 token), or None where it does not: macOS,
    a GPU, `MLXSERVE_PORTABLE=1`, or OpenBLAS loaded."""
    from .policy import current_policy

    if sys.platform != "linux" or not current_policy().cpu_tricks or _openblas_loaded():
        return None
    if os.environ.get("MLXSERVE_NO_OPENBLAS"):
        return "MLXSERVE_NO_OPENBLAS is set"
    library = _installed_openblas()
    if library is None:
        return f"OpenBLAS is not installed: {INSTALL_OPENBLAS}"
    return f"OpenBLAS is not preloaded (`mlxserve serve` preloads it; else LD_PRELOAD={library})"


def _openblas_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return any("libopenblas" in line for line in maps)


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def cpu_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` plus what MLX's CPU backend runs best under on Linux: OpenBLAS preloaded, and malloc
    asking for transparent huge pages (`MLXSERVE_NO_HUGE_PAGES=1` opts out of those)."""
    out = dict(env)
    if sys.platform != "linux":
        return out
    library = openblas_library()
    preloaded = env.get("LD_PRELOAD", "")
    if library is not None and library not in preloaded:
        out["LD_PRELOAD"] = f"{library}:{preloaded}" if preloaded else library
    tunables = env.get("GLIBC_TUNABLES", "")
    if not env.get("MLXSERVE_NO_HUGE_PAGES") and "glibc.malloc.hugetlb" not in tunables:
        out["GLIBC_TUNABLES"] = (
            f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
        )
    return out


def reexec_for_cpu() -> None:
    """Replace this process with itself under `cpu_environment`, once; a no-op where that
    changes nothing (macOS, portable mode, or already re-executed)."""
    if portable():
        return
    env = cpu_environment(os.environ)
    if env == dict(os.environ):
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


# MXCSR bits: flush denormal results to zero, and read denormal inputs as zero.
FLUSH_TO_ZERO, DENORMALS_ARE_ZERO = 0x8000, 0x0040
_MXCSR_OFFSET = 28  # in glibc's x86-64 fenv_t (32 bytes), after the x87 state


def flush_denormals() -> bool:
    """x86-64 Linux: treat denormal floats as zero in this thread and the threads it starts, and
    restart OpenBLAS's threads (started when it loaded) so they do too. Call before MLX starts.

    As a model trains, some float32 values fall below 1e-38, and every matrix product touching
    them runs at a fraction of its speed: the demo model's 16 x 256 training step went from 1.5 s
    to 2.1-2.4 s by step 400 (3.1 s with one BLAS thread), and back to 1.5 s with these bits set.
    Values that small do not move a float32 result. Returns whether the bits were set."""
    import ctypes
    import platform

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    libm = ctypes.CDLL("libm.so.6")
    env = (ctypes.c_uint8 * 32)()
    if libm.fegetenv(env) != 0:
        return False
    field = slice(_MXCSR_OFFSET, _MXCSR_OFFSET + 4)
    mxcsr = int.from_bytes(bytes(env[field]), "little") | FLUSH_TO_ZERO | DENORMALS_ARE_ZERO
    env[field] = list(mxcsr.to_bytes(4, "little"))
    if libm.fesetenv(env) != 0:
        return False
    process = ctypes.CDLL(None)
    if hasattr(process, "blas_thread_shutdown_"):  # OpenBLAS preloaded: its next call restarts
        process.blas_thread_shutdown_()
    return True


def warn_if_slow() -> None:
    """Say at start, where MLX's CPU backend will run on its reference BLAS."""
    import logging

    reason = slow_blas_reason()
    if reason is not None:
        logging.getLogger("mlxserve").warning(
            "MLX's CPU backend runs on its reference BLAS, 10-30x slower than OpenBLAS on "
            "prompts and batches: %s",
            reason,
        )
