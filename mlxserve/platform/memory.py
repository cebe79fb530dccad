"""Handing freed memory back to the system, so a long-running server's RSS stays flat.

MLX's CPU backend, numpy, the tokenizers and llguidance allocate through malloc from several
threads. glibc gives each thread its own arena and keeps what is freed there, so RSS grew over a
long soak (scripts/soak.py). Two arenas and a trim now and then (the engine's) keep it flat. What
a trim gives back, the next large blocks take as new pages, slow to touch on some VMs: large
blocks stay in malloc's heap once freed, and trims are seldom. Elsewhere (macOS) only MLX's
cache is cleared.

The same under `--distributed`.
"""

from __future__ import annotations

import ctypes
import sys

import mlx.core as mx

M_ARENA_MAX = -8  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
M_TRIM_THRESHOLD = -1
# Blocks up to this size come from malloc's heap, not a mapping of their own: a freed KV buffer's
# pages are then reused, where a new mapping is new pages (slow to touch on some VMs)
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept, up to this, for the next blocks


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
    """At most `count` malloc arenas for the threads started from now on, and large blocks kept
    in them once freed (returned to the system by `release_freed_memory`'s trim)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_ARENA_MAX, count)
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def release_freed_memory(trim: bool = True, clear_cache: bool = True) -> None:
    """Drop MLX's cache of freed buffers (`clear_cache`), then (`trim`) return free malloc pages
    to the system."""
    if clear_cache:
        mx.clear_cache()
    if trim and _LIBC is not None:
        _LIBC.malloc_trim(0)
