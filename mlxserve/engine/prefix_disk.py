"""The prefix cache on disk: long prompts' KV kept in files, so that a restarted server starts a
repeated prompt from them instead of prefilling it again.

Files are in mlx-lm's prompt-cache format (safetensors; what `load_prompt_cache` reads) with our
metadata: the model's fingerprint, the mlxserve version, the tokens the file holds and a
checksum of its arrays. A file that does not match (corrupt, truncated, another model's or
another version's) is never loaded. The engine thread only hands over arrays it has evaluated;
a thread of its own writes them a few seconds later (a prompt that a newer one mostly repeats
meanwhile is not written), and removes the least recently used files over the byte budget. A
write that fails (a full disk) turns writing off: the cache stays in memory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import cache as mlx_lm_cache

log = logging.getLogger("mlxserve.engine")

FORMAT = "1"  # this file's layout of the metadata below
SUFFIX = ".safetensors"
# Prompts shorter than this are not written: prefilling them again costs little.
MIN_TOKENS = 1024
# A disk entry is loaded only where it gives this many more tokens than memory does.
MIN_GAIN = 256
# A kept prompt waits this long before it is written: an editor's next keystroke, or the same
# conversation's answer, usually supersedes it by then.
DEBOUNCE_S = 2.0
# A newer entry supersedes an older one (queued or on disk) that it repeats this share of.
SUPERSEDE_SHARE = 0.9
MAX_QUEUED = 4  # entries waiting to be written; beyond, the oldest is dropped
DEFAULT_SHARE_OF_FREE_DISK = 10  # the default budget: a tenth of the disk's free space,
MAX_DEFAULT_BYTES = 16 << 30  # at most this
MAX_HEADER_BYTES = 64 << 20
FINGERPRINT_BLOCKS = 16  # blocks sampled across each weight file
FINGERPRINT_BLOCK_BYTES = 64 << 10
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a crash
# Our files, the only ones counted against the budget and removed: the folder may hold others.
OUR_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{32}\.safetensors")


def default_budget_bytes(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(free // DEFAULT_SHARE_OF_FREE_DISK, MAX_DEFAULT_BYTES)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("mlxserve")
    except PackageNotFoundError:
        return "unknown"


def model_fingerprint(folder: Path, how_it_runs: str) -> str | None:
    """What the KV of a token sequence depends on: the config, the weights (each file's size and
    blocks sampled across it: hashing gigabytes would slow every start), and how the platform
    runs them (`how_it_runs`: weights converted or not). None where there is no folder to read."""
    digest = hashlib.sha256(how_it_runs.encode())
    try:
        digest.update((folder / "config.json").read_bytes())
        weights = sorted(folder.glob("*.safetensors"))
        for path in weights:
            size = path.stat().st_size
            digest.update(f"{path.name}:{size}".encode())
            with path.open("rb") as file:
                for i in range(FINGERPRINT_BLOCKS):
                    file.seek(size * i // FINGERPRINT_BLOCKS)
                    digest.update(file.read(FINGERPRINT_BLOCK_BYTES))
    except OSError:
        return None
    return digest.hexdigest() if weights else None


@dataclass
class DiskEntry:
    path: Path
    tokens: np.ndarray  # int32, the positions the file's KV holds
    nbytes: int


@dataclass
class _Job:
    tokens: np.ndarray
    arrays: dict[str, mx.array]  # evaluated on the engine thread
    classes: list[str]
    scalars: list
    queued: float


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _tokens_text(tokens: np.ndarray) -> str:
    return base64.b64encode(tokens.astype("<i4").tobytes()).decode()


def _tokens_of(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i4").astype(np.int32)


def _checksum(arrays: dict[str, mx.array]) -> str:
    crc = 0
    for key in sorted(arrays):
        crc = zlib.crc32(memoryview(arrays[key]), crc)
    return f"{crc:08x}"


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header, checked against the file's size (a truncated file fails)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > MAX_HEADER_BYTES:
            raise ValueError("header length out of range")
        header = json.loads(file.read(length))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if 8 + length + max(ends, default=0) != path.stat().st_size:
        raise ValueError("truncated (its size is not what its header says)")
    return header


class DiskPrefixStore:
    """One model's entries in `folder` (other models' files share the folder and its budget)."""

    def __init__(self, folder: Path, max_bytes: int, fingerprint: str):
        self.folder = folder
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint
        self.version = version()
        self.writable = True
        self.written = 0  # files written by this process
        self.loaded = 0  # entries loaded from disk
        self._prefix = fingerprint[:16]
        self._lock = threading.Lock()  # the index, shared with the writer thread
        self._entries: dict[str, DiskEntry] = {}  # file name: entry, this model's
        self._unready: list[_Job] = []
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._temp_names = iter(range(1 << 62))
        folder.mkdir(parents=True, exist_ok=True)
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="mlxserve-kv-disk")
        self._writer.daemon = True
        self._writer.start()

    # ---- the engine thread ------------------------------------------------------------------

    def best(self, prompt: list[int], beyond: int) -> tuple[DiskEntry, int] | None:
        """The entry sharing the longest prefix with `prompt`, and that prefix's length, where
        it is at least MIN_GAIN tokens more than `beyond` (what memory gives)."""
        if len(prompt) < beyond + MIN_GAIN:
            return None
        ids = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            entries = list(self._entries.values())
        found = max(
            ((e, common_prefix(e.tokens, ids)) for e in entries), key=lambda x: x[1], default=None
        )
        if found is None or found[1] < beyond + MIN_GAIN:
            return None
        return found

    def load(self, entry: DiskEntry) -> list[Any] | None:
        """The entry's KV, checked; None (with a log line) where the file does not hold what
        its name and index say."""
        try:
            arrays, flat = mx.load(str(entry.path), return_metadata=True)
            metadata, classes, scalars = tree_unflatten(list(flat.items()))
            problem = self._mismatch(metadata)
            if problem is None and _tokens_of(metadata["tokens"]).tolist() != entry.tokens.tolist():
                problem = "its tokens are not those of its index entry"
            if problem is None:
                mx.eval(arrays)
                if _checksum(arrays) != metadata.get("checksum"):
                    problem = "its arrays do not match their checksum (corrupt)"
            cache = None if problem else _caches(arrays, classes, scalars)
            if cache is not None and not _holds(cache, len(entry.tokens)):
                problem = "its KV does not hold as many positions as its tokens"
        except FileNotFoundError:
            self._forget(entry.path.name)
            return None
        except Exception as error:  # a file cut short or damaged fails in many ways
            problem = f"unreadable ({type(error).__name__}: {error})"
        if problem is not None:
            log.warning("prefix cache: ignoring %s: %s", entry.path, problem)
            self._forget(entry.path.name, remove=True)
            return None
        _touch(entry.path)  # recently used: evicted last
        self.loaded += 1
        return cache

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache`, the KV of `tokens`, for writing: its arrays laid out contiguous (on
        the device, with the model's work) and handed over at `hand_over`, once that has run."""
        if not (self.writable and len(tokens) >= MIN_TOKENS):
            return
        ids = np.asarray(tokens, dtype=np.int32)
        near = self.best(tokens, beyond=len(tokens) - 2 * MIN_GAIN)
        if near is not None:  # a file holds all but MIN_GAIN of these tokens, or more
            _touch(near[0].path)
            return
        arrays, classes, scalars = _flatten(cache)
        arrays = {key: mx.contiguous(value) for key, value in arrays.items()}
        mx.async_eval(list(arrays.values()))
        self._unready.append(_Job(ids, arrays, classes, scalars, 0))

    def hand_over(self) -> None:
        """Give the writer what was put since the last call (the writer thread must not run
        MLX work: its arrays are evaluated here, at no cost once the step that made them ran)."""
        for job in self._unready:
            mx.eval(list(job.arrays.values()))
            job.queued = time.monotonic()
            self._jobs.put(job)
        self._unready = []

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued now (no debounce), for at most `timeout` seconds."""
        self.hand_over()
        self._stop.set()
        self._jobs.put(None)  # wakes the writer
        self._writer.join(timeout)

    @property
    def entries(self) -> int:
        return len(self._entries)

    # ---- the index ---------------------------------------------------------------------------

    def _mismatch(self, metadata: dict[str, str]) -> str | None:
        if metadata.get("mlxserve_prefix_cache") != FORMAT:
            return "not an mlxserve prefix-cache file of this format"
        if metadata.get("version") != self.version:
            return f"written by mlxserve {metadata.get('version')}, this is {self.version}"
        if metadata.get("fingerprint") != self.fingerprint:
            return "written for another model"
        return None

    def _scan(self) -> None:
        """Index this model's files; files that cannot be this model's are skipped (others')
        or left out with a log line (ours, but unreadable or from another version)."""
        now = time.time()
        for path in self.folder.iterdir():
            if path.name.startswith(".tmp-"):
                if now - _mtime(path) > STALE_TEMP_S:
                    path.unlink(missing_ok=True)
                continue
            if not (OUR_NAME.fullmatch(path.name) and path.name.startswith(self._prefix)):
                continue
            try:
                header = read_header(path)
                flat = header.get("__metadata__", {})
                metadata = tree_unflatten(list(flat.items()))[0]
                problem = self._mismatch(metadata)
                tokens = None if problem else _tokens_of(metadata["tokens"])
            except Exception as error:
                problem, tokens = f"unreadable ({type(error).__name__}: {error})", None
            if problem is not None:
                log.warning("prefix cache: ignoring %s: %s", path, problem)
                continue
            self._entries[path.name] = DiskEntry(path, tokens, path.stat().st_size)
        if self._entries:
            total = sum(e.nbytes for e in self._entries.values())
            log.info(
                "prefix cache on disk: %d entries for this model (%.0f MiB) in %s",
                len(self._entries),
                total / (1 << 20),
                self.folder,
            )

    def _forget(self, name: str, remove: bool = False) -> None:
        with self._lock:
            entry = self._entries.pop(name, None)
        if remove and entry is not None:
            entry.path.unlink(missing_ok=True)

    # ---- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        """Write each job once it is DEBOUNCE_S old, unless a newer one supersedes it first;
        once stopping, write what is left at once."""
        waiting: list[_Job] = []
        while True:
            stopping = self._stop.is_set()
            try:
                if stopping:
                    job = self._jobs.get(block=False)
                elif waiting:
                    job = self._jobs.get(
                        timeout=max(0.001, waiting[0].queued + DEBOUNCE_S - time.monotonic())
                    )
                else:
                    job = self._jobs.get()
            except queue.Empty:
                job = None
            if job is not None:
                waiting = [w for w in waiting if not _supersedes(job.tokens, w.tokens)]
                waiting = [*waiting[-(MAX_QUEUED - 1) :], job]
                continue
            for due in [w for w in waiting if stopping or _due(w)]:
                waiting.remove(due)
                if not self.writable:
                    continue
                try:
                    self._write(due)
                except Exception:  # never the writer's end: memory goes on without it
                    log.exception("prefix cache: writing to %s failed", self.folder)
                    self.writable = False
            if stopping and self._jobs.empty():
                return

    def _write(self, job: _Job) -> None:
        name = f"{self._prefix}-{hashlib.sha256(job.tokens.tobytes()).hexdigest()[:32]}{SUFFIX}"
        final = self.folder / name
        temp = self.folder / f".tmp-{os.getpid()}-{next(self._temp_names)}{SUFFIX}"
        metadata = {
            "mlxserve_prefix_cache": FORMAT,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "tokens": _tokens_text(job.tokens),
            "checksum": _checksum(job.arrays),
        }
        flat = dict(tree_flatten([metadata, job.classes, job.scalars]))
        try:
            mx.save_safetensors(str(temp), job.arrays, flat)
            os.replace(temp, final)
        except (OSError, RuntimeError) as error:  # MLX reports a failed write as the latter
            temp.unlink(missing_ok=True)
            self.writable = False
            log.warning(
                "prefix cache: writing to %s failed (%s); it stays in memory from now on",
                self.folder,
                error,
            )
            return
        self.written += 1
        entry = DiskEntry(final, job.tokens, final.stat().st_size)
        with self._lock:
            older = [
                e
                for e in self._entries.values()
                if e.path != final and _supersedes(job.tokens, e.tokens)
            ]
            for e in older:
                del self._entries[e.path.name]
            self._entries[name] = entry
        for e in older:
            e.path.unlink(missing_ok=True)
        self._evict()

    def _evict(self) -> None:
        """Remove the least recently used files of the folder (any model's) over the budget."""
        files = [p for p in self.folder.iterdir() if OUR_NAME.fullmatch(p.name)]
        sized = sorted(((_mtime(p), p, _size(p)) for p in files), key=lambda x: x[0])
        total = sum(size for _, _, size in sized)
        for _, path, size in sized:
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            self._forget(path.name)
            total -= size


def _due(job: _Job) -> bool:
    return time.monotonic() >= job.queued + DEBOUNCE_S


def _supersedes(newer: np.ndarray, older: np.ndarray) -> bool:
    return common_prefix(newer, older) >= SUPERSEDE_SHARE * len(older)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _flatten(cache: list[Any]) -> tuple[dict[str, mx.array], list[str], list]:
    """`cache` as mlx-lm's `save_prompt_cache` lays it out: its layers' states flattened, the
    non-array parts of a state as arrays, listed in `scalars`, and each layer's class."""
    scalars: list = [""]  # never empty: tree_flatten drops an empty list
    arrays = {}
    for key, value in tree_flatten([c.state for c in cache]):
        if isinstance(value, mx.array):
            arrays[key] = value
        elif isinstance(value, bool | int | float):
            scalars.append((key, "scalar"))
            arrays[key] = mx.array(value)
        elif isinstance(value, str):
            scalars.append((key, "string"))
            arrays[key] = mx.array([ord(c) for c in value])
        elif value is None:
            scalars.append((key, "none"))
            arrays[key] = mx.array([])
        else:
            raise ValueError(f"a cache state that cannot be written: {type(value).__name__}")
    return arrays, [type(c).__name__ for c in cache], scalars


def _caches(arrays: dict[str, mx.array], classes: list[str], scalars: list) -> list[Any]:
    """The layers `_flatten` laid out (what mlx-lm's `load_prompt_cache` does, from arrays
    already read)."""
    values: dict[str, Any] = dict(arrays)
    for key, kind in scalars[1:]:
        if kind == "scalar":
            values[key] = values[key].item()
        elif kind == "string":
            values[key] = "".join(chr(i) for i in values[key].tolist())
        else:
            values[key] = None
    states = tree_unflatten(list(values.items()))
    return [getattr(mlx_lm_cache, c).from_state(s) for c, s in zip(classes, states)]


def _holds(cache: list[Any], positions: int) -> bool:
    return all(c.offset == positions for c in cache if type(c) is mlx_lm_cache.KVCache)
