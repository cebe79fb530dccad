"""Handing freed memory back to the system, so a long-running server's RSS stays flat.

MLX's CPU backend, numpy, the tokenizers and llguidance allocate through malloc from several
threads. glibc gives each thread its own arena and keeps what is freed there, so RSS grew over a
long soak (scripts/soak.py). Two arenas and a trim whenever MLX's buffer cache is cleared keep it
flat. Elsewhere (macOS) only MLX's cache is cleared.

The same under `--distributed`.
"""

from __future__ import annotations

import ctypes
import sys

import mlx.core as mx

M_ARENA_MAX = -8  # glibc's mallopt parameter


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # not glibc (musl)
        return None


_LIBC = _glibc()


def limit_malloc_arenas(count: int = 2) -> None:
    """At most `count` malloc arenas for the threads started from now on."""
    if _LIBC is not None:
        _LIBC.mallopt(M_ARENA_MAX, count)


def release_freed_memory(trim: bool = True, clear_cache: bool = True) -> None:
    """Drop MLX's cache of freed buffers (`clear_cache`), then (`trim`) return free malloc pages
    to the system."""
    if clear_cache:
        mx.clear_cache()
    if trim and _LIBC is not None:
        _LIBC.malloc_trim(0)
