"""Checkpoints on disk, for a restarted server: the whole state of a model whose caches cannot
be trimmed (prefix/checkpoints.py), one file a checkpoint, as mlx-lm's `save_prompt_cache`
writes any kind of cache (each layer's state and meta state, its class's name).

A file is named by a hash of the model's fingerprint and of its tokens, and holds both in its
metadata: a prompt finds the longest file whose tokens it starts with by hashing its own first
tokens at each length a file has. Files are written while the engine idles (a checkpoint is the
whole state, up to hundreds of MB on a real model: not a copy to make beside running streams);
the oldest go first over the folder's budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from ...versions import mlxserve_version

log = logging.getLogger("mlxserve.engine")

CHECKPOINTS_FOLDER = "checkpoints"  # under the prefix cache's folder
MIN_TOKENS = 1024  # shorter prompts are quicker read again than from disk
MAX_WAITING = 8  # checkpoints waiting for an idle moment; older ones are not written
SUFFIX = ".safetensors"
# mlx-lm's save_prompt_cache flattens [its layers' meta state, the caller's metadata, ...]
METADATA_KEY = "0.mlxserve"


def _digest(fingerprint: str, tokens: list[int]) -> str:
    data = json.dumps([fingerprint, list(tokens)], separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:40]


def _metadata(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, from its header alone (8 bytes of length, then JSON)."""
    with path.open("rb") as file:
        size = int.from_bytes(file.read(8), "little")
        if not 0 < size < 1 << 26:
            raise ValueError("not a safetensors header")
        return json.loads(file.read(size)).get("__metadata__", {})


@dataclass
class Stored:
    path: Path
    length: int
    nbytes: int


class CheckpointFiles:
    """One model's checkpoints in `folder`, within `budget_bytes` (shared with other models')."""

    def __init__(self, folder: Path, budget_bytes: int, fingerprint: str):
        self.folder = folder
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        self._waiting: list[tuple[list[int], list]] = []
        self._by_digest: dict[str, Stored] = {}
        self.loaded = 0
        self._scan()

    def _scan(self) -> None:
        """The model's files already in the folder (their lengths from their metadata)."""
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                info = json.loads(_metadata(path).get(METADATA_KEY, "{}"))
            except (OSError, ValueError):
                continue
            if info.get("fingerprint") == self.fingerprint and info.get("digest"):
                stored = Stored(path, int(info["length"]), path.stat().st_size)
                self._by_digest[info["digest"]] = stored

    @property
    def entries(self) -> int:
        return len(self._by_digest)

    def put(self, tokens: list[int], cache: list) -> None:
        """Keep `cache`, the state after `tokens` (detached from the batch), for the next idle
        moment."""
        if len(tokens) < MIN_TOKENS:
            return
        self._waiting = [*self._waiting, (list(tokens), cache)][-MAX_WAITING:]

    def write_waiting(self) -> None:
        """Write what waits (the engine is idle, or the model is leaving)."""
        waiting, self._waiting = self._waiting, []
        for tokens, cache in waiting:
            digest = _digest(self.fingerprint, tokens)
            if digest in self._by_digest:
                continue
            path = self.folder / f"{digest}{SUFFIX}"
            info = {
                "fingerprint": self.fingerprint,
                "digest": digest,
                "length": len(tokens),
                "version": mlxserve_version() or "",
            }
            try:
                save_prompt_cache(str(path), cache, {"mlxserve": json.dumps(info)})
            except OSError as error:
                log.warning("prefix cache: a checkpoint could not be written (%s)", error)
                path.unlink(missing_ok=True)
                return
            self._by_digest[digest] = Stored(path, len(tokens), path.stat().st_size)
        self._evict()

    def best(self, prompt: list[int], covered: int) -> Stored | None:
        """The longest file whose tokens `prompt` starts with, longer than `covered` and
        leaving at least the prompt's last token to read."""
        lengths = sorted({s.length for s in self._by_digest.values()}, reverse=True)
        for length in lengths:
            if length <= covered:
                return None
            if length >= len(prompt):
                continue
            stored = self._by_digest.get(_digest(self.fingerprint, prompt[:length]))
            if stored is not None:
                return stored
        return None

    def load(self, stored: Stored) -> list | None:
        """The checkpoint's caches, evaluated; None where the file is gone or unreadable."""
        try:
            cache = load_prompt_cache(str(stored.path))
            mx.eval([c.state for c in cache])
        except (OSError, RuntimeError, ValueError) as error:
            log.warning("prefix cache: checkpoint %s not read (%s)", stored.path.name, error)
            self._forget(stored)
            return None
        os.utime(stored.path)  # recently used: evicted last
        self.loaded += 1
        return cache

    def _forget(self, stored: Stored) -> None:
        self._by_digest = {d: s for d, s in self._by_digest.items() if s is not stored}
        stored.path.unlink(missing_ok=True)

    def _evict(self) -> None:
        """The least recently used files of the folder go while it is over its budget."""
        files = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            self._by_digest = {d: s for d, s in self._by_digest.items() if s.path != path}
