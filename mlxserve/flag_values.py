"""The values of `mlxserve serve`'s flags read from their text: sizes, NAME=VALUE pairs, the
stream-gap bound, a pipeline's layers by rank, the API key. argparse types raise
ArgumentTypeError; the key, ValueError."""

from __future__ import annotations

import argparse
import os

from .settings import machine_memory_bytes


def memory_size(text: str) -> int:
    """--memory-budget: bytes, with a K/M/G/T suffix (powers of 1024), or a share of this
    machine's memory (60%)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if value.endswith("%"):
            share = float(value[:-1])
            if not 0 < share <= 100:
                raise ValueError
            return int(machine_memory_bytes() * share / 100)
        scale = 1024 ** ("KMGT".index(value[-1]) + 1) if value[-1:] in tuple("KMGT") else 1
        number = float(value[:-1] if scale > 1 else value)
    except (ValueError, IndexError) as error:
        raise argparse.ArgumentTypeError(
            f"not a size (12G, 800M) or a share (60%): {text}"
        ) from error
    if number <= 0:
        raise argparse.ArgumentTypeError(f"a memory budget must be above 0: {text}")
    return int(number * scale)


def name_and_value(text: str) -> tuple[str, str]:
    """--adapter and --alias: NAME=VALUE, both non-empty."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def stream_gap(text: str) -> float | None:
    """--max-stream-gap: a number above 1, or 'off'."""
    if text.strip().lower() in ("off", "none", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 1 or value != value:
        raise argparse.ArgumentTypeError(f"must be a number above 1 or 'off' (got {text!r})")
    return value


def layer_split(text: str) -> tuple[int, ...]:
    """--layer-split 8,22: a pipeline's layers by rank, rank 0 first."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not layer counts like 8,22: {text}") from None
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"every rank needs at least one layer: {text}")
    return counts


def read_api_key(key: str | None, key_file: str | None) -> str | None:
    """The key from --api-key, else the first line of --api-key-file; a file must hold one."""
    if key:
        return key
    if not key_file:
        return None
    try:
        with open(os.path.expanduser(key_file), encoding="utf-8") as file:
            first = file.readline().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the API key file {key_file}: {error}") from error
    if not first:
        raise ValueError(f"the API key file {key_file} is empty")
    return first
