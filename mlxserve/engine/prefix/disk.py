"""The prefix cache on disk: long prompts' KV kept in files, so that a restarted server starts a
repeated prompt from them instead of prefilling it again.

A prompt's KV is cut into segments of BLOCK tokens (the last one shorter), each a safetensors
file named by a hash of its tokens and of the segment before it, so a file stands for one
exact prefix. A conversation's next turn, or an agent's next step, writes only the segments it
added: what it repeats is on disk already. A file's metadata holds the model's fingerprint, the
mlxserve version, its tokens, its parent segment and a checksum of its arrays: a file that does
not match (corrupt, truncated, another model's or another version's) is never loaded.

The engine thread only hands over arrays it has evaluated; a thread of its own writes them a
few seconds later (a prompt that a newer one mostly repeats meanwhile is not written) and, over
the byte budget, removes the least recently used files, a chain's last segments first. A write
that fails (a full disk) turns writing off: the cache stays in memory.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ...versions import mlxserve_version
from ..mlx_lm_compat.quantized_kv import QuantizedRowKVCache
from .files import (
    DTYPES,
    checksum,
    load_safetensors,
    new_layer,
    packing_metadata,
    read_header,
    save_safetensors,
    tokens_of,
    tokens_text,
)
from .memory import COPY_BUDGET_BYTES

log = logging.getLogger("mlxserve.engine")

FORMAT = "2"  # this file's layout of the metadata below
BLOCK = 256  # tokens a segment holds (a prompt's last segment: fewer)
# Prompts shorter than this are not written: prefilling them again costs little.
MIN_TOKENS = 1024
# Disk is read only where it gives this many more tokens than memory does.
MIN_GAIN = 256
# A kept prompt waits this long before it is written: an editor's next keystroke, or the same
# conversation's answer, usually supersedes it by then.
DEBOUNCE_S = 2.0
# A newer prompt supersedes a waiting older one that it repeats this share of.
SUPERSEDE_SHARE = 0.9
MAX_QUEUED = 4  # prompts waiting to be written; beyond, the oldest is dropped
DEFAULT_SHARE_OF_FREE_DISK = 10  # the default budget: a tenth of the disk's free space,
MAX_DEFAULT_BYTES = 16 << 30  # at most this
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a crash
# Our files, the only ones counted against the budget and removed: the folder may hold others.
OUR_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{32}\.safetensors")
SUFFIX = ".safetensors"


def default_budget_bytes(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(free // DEFAULT_SHARE_OF_FREE_DISK, MAX_DEFAULT_BYTES)


def segment_key(parent: str, tokens: np.ndarray) -> str:
    """A segment's identity: its tokens after everything its parent stands for."""
    return hashlib.sha256(parent.encode() + tokens.astype("<i4").tobytes()).hexdigest()


@dataclass
class Segment:
    key: str
    parent: str  # the previous segment's key (the model's fingerprint for a first one)
    tokens: np.ndarray  # int32
    path: Path


@dataclass
class _Piece:
    """A segment to write: positions [start, start + len(tokens)) of the job's layers."""

    key: str
    parent: str
    start: int
    tokens: np.ndarray


@dataclass
class _Job:
    tokens: np.ndarray  # the whole prompt
    pieces: list[_Piece]
    sources: list[tuple[mx.array, mx.array]]  # each layer's keys and values, not copied yet
    low: int  # the first position to write: copies hold positions [low, len(tokens))
    layers: list[tuple[mx.array, mx.array]] = field(default_factory=list)  # the copies
    copied: bool = False  # every copy made, in an engine step before this one
    views: list[tuple[np.ndarray, np.ndarray]] | None = None  # the copies, for the writer
    dtype: str = "F32"
    packing: dict[str, str] | None = None  # quantized KV's, for the metadata
    queued: float = 0.0


@dataclass
class Read:
    """A chain's KV read from disk, not yet the model's caches (`DiskPrefixStore.adopt`)."""

    tokens: np.ndarray  # the positions it holds
    layers: list[tuple[np.ndarray, np.ndarray]]  # each layer's keys and values
    kind: dict[str, str]  # its first file's metadata: what kind of cache holds it
    cache: list[KVCache] = field(default_factory=list)  # the layers made the model's so far


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def writable_cache(cache: list[Any]) -> bool:
    """Whether `cache` cuts into segments: every layer a plain KV cache (a sliding window's or
    a state-space layer's cache does not)."""
    kinds = (KVCache, QuantizedRowKVCache)
    return bool(cache) and all(type(c) in kinds and c.keys is not None for c in cache)


class DiskPrefixStore:
    """One model's segments in `folder` (other models' files share the folder and its budget)."""

    def __init__(self, folder: Path, max_bytes: int, fingerprint: str):
        self.folder = folder
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint
        self.version = mlxserve_version()
        self.writable = True
        self.written = 0  # files written by this process
        self.loaded = 0  # prompts started from disk
        self._prefix = fingerprint[:16]
        self._lock = threading.Lock()  # the index, shared with the writer thread
        self._segments: dict[str, Segment] = {}  # key: segment, this model's
        self._children: dict[str, dict[str, Segment]] = defaultdict(dict)  # parent key: ...
        self._unready: list[_Job] = []
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._temp_names = iter(range(1 << 62))
        folder.mkdir(parents=True, exist_ok=True)
        self._scan()
        self._evict()  # a budget lowered since the last run
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="mlxserve-kv-read")
        self._writer = threading.Thread(target=self._write_loop, name="mlxserve-kv-disk")
        self._writer.daemon = True
        self._writer.start()

    # ---- the engine thread ------------------------------------------------------------------

    def best(self, prompt: list[int], beyond: int) -> tuple[list[Segment], int] | None:
        """The chain of segments sharing the longest prefix with `prompt` (its last segment
        possibly in part), and that prefix's length, where it is at least MIN_GAIN tokens more
        than `beyond` (what memory gives)."""
        if len(prompt) < beyond + MIN_GAIN:
            return None
        ids = np.asarray(prompt, dtype=np.int32)
        chain, shared, parent = [], 0, self.fingerprint
        with self._lock:
            while shared < len(ids):
                found, length = None, 0
                for segment in self._children.get(parent, {}).values():
                    n = common_prefix(segment.tokens, ids[shared:])
                    if n > length:
                        found, length = segment, n
                if found is None:
                    break
                chain.append(found)
                shared += length
                if length < len(found.tokens):
                    break
                parent = found.key
        if shared < beyond + MIN_GAIN:
            return None
        return chain, shared

    def load(self, chain: list[Segment], shared: int) -> tuple[list[KVCache], int] | None:
        """The KV of the chain's first `shared` positions, as far as its files check out (a
        file that does not is removed, with a log line): (the layers, their positions)."""
        return self.adopt(self.read(chain, shared))

    def read(self, chain: list[Segment], shared: int) -> Read | None:
        """The chain's files read and checked, into numpy (no MLX work: any thread may)."""
        keys: list[list[np.ndarray]] = []
        values: list[list[np.ndarray]] = []
        positions, kind, tokens = 0, None, []
        for segment in chain:
            read = self._read(segment)
            if read is None:
                break
            arrays, metadata = read
            kind = kind or metadata
            layers = len(arrays) // 2
            if keys and layers != len(keys):
                break
            keys = keys or [[] for _ in range(layers)]
            values = values or [[] for _ in range(layers)]
            for i in range(layers):
                keys[i].append(arrays[f"k.{i}"])
                values[i].append(arrays[f"v.{i}"])
            positions += len(segment.tokens)
            tokens.append(segment.tokens)
            _touch(segment.path)
        positions = min(positions, shared)
        if not positions:
            return None
        layers = [
            (
                np.concatenate(k, axis=2)[..., :positions, :],
                np.concatenate(v, axis=2)[..., :positions, :],
            )
            for k, v in zip(keys, values)
        ]
        return Read(np.concatenate(tokens)[:positions], layers, kind)

    def adopt(
        self, read: Read | None, budget_bytes: int | None = None
    ) -> tuple[list[KVCache], int] | None:
        """What `read` read, as the model's caches (engine thread): (the layers, positions);
        with `budget_bytes`, only that many bytes' layers a call (None until all are)."""
        if read is None:
            return None
        spent = 0
        while len(read.cache) < len(read.layers) and (budget_bytes is None or spent < budget_bytes):
            k, v = read.layers[len(read.cache)]
            layer = new_layer(read.kind)
            layer.keys, layer.values = (
                mx.array(a).view(mx.bfloat16) if a.dtype == np.uint16 else mx.array(a)
                for a in (k, v)
            )
            layer.offset = len(read.tokens)
            mx.async_eval(layer.keys, layer.values)
            read.cache.append(layer)
            spent += k.nbytes + v.nbytes
        if len(read.cache) < len(read.layers):
            return None
        mx.eval([(c.keys, c.values) for c in read.cache])
        self.loaded += 1
        return read.cache, len(read.tokens)

    def prefetch(self, chain: list[Segment], shared: int, done: Callable[[Read | None], None]):
        """`read` on a thread of its own; `done(read)` there when it has."""

        def run() -> None:
            try:
                result = self.read(chain, shared)
            except Exception:
                log.exception("prefix cache: reading %s failed", self.folder)
                result = None
            done(result)

        self._reader.submit(run)

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache`, the KV of `tokens`, for writing the segments not on disk yet (handed
        over at `hand_over`, once the work that made it has run)."""
        if not (self.writable and len(tokens) >= MIN_TOKENS and writable_cache(cache)):
            return
        dtype = DTYPES.get(cache[0].keys.dtype)
        packing = packing_metadata(cache)
        if dtype is None or (packing is None and dtype == "U32"):
            return
        ids = np.asarray(tokens, dtype=np.int32)
        pieces, parent = [], self.fingerprint
        for start in range(0, len(ids), BLOCK):
            part = ids[start : start + BLOCK]
            key = segment_key(parent, part)
            if key not in self._segments and not self._covered(parent, part):
                pieces.append(_Piece(key, parent, start, part))
            parent = key
        if not pieces:
            return
        sources = [(c.keys, c.values) for c in cache]
        low = pieces[0].start
        self._unready.append(_Job(ids, pieces, sources, low, dtype=dtype, packing=packing))

    def hand_over(self, budget_bytes: int | None = COPY_BUDGET_BYTES) -> None:
        """Copy the positions to write of what was put, contiguous (numpy reads them; a finished
        sequence's KV is a view of the batch's buffers), on the device with the steps' work, a
        few layers a step within `budget_bytes` (None: all now, no stream waiting): copied at
        once, a long prompt's held the streams beside it for several of their steps. A job
        copied in an earlier step goes to the writer as numpy views of its copies (evaluating
        them then costs nothing; the writer thread runs no MLX work)."""
        waiting = []
        for job in self._unready:
            if job.copied:
                self._give(job)
            else:
                waiting.append(job)
        spent = 0
        for job in waiting:
            while job.sources and (budget_bytes is None or spent < budget_bytes):
                copies = [
                    mx.contiguous(array[..., job.low : len(job.tokens), :])
                    for array in job.sources.pop(0)
                ]
                if job.dtype == "BF16":  # numpy has no bfloat16: its bits, as they are
                    copies = [c.view(mx.uint16) for c in copies]
                mx.async_eval(copies)
                job.layers.append(tuple(copies))
                spent += sum(c.nbytes for c in copies)
            job.copied = not job.sources
        self._unready = [job for job in waiting if budget_bytes is not None or not job.copied]
        if budget_bytes is None:
            for job in waiting:
                self._give(job)

    def _give(self, job: _Job) -> None:
        mx.eval(job.layers)
        job.views = [(np.asarray(memoryview(k)), np.asarray(memoryview(v))) for k, v in job.layers]
        job.sources = []
        job.queued = time.monotonic()
        self._jobs.put(job)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued now (no debounce), for at most `timeout` seconds."""
        self.hand_over(None)
        self._stop.set()
        self._jobs.put(None)  # wakes the writer
        self._writer.join(timeout)
        self._reader.shutdown(wait=False, cancel_futures=True)

    @property
    def entries(self) -> int:
        return len(self._segments)

    # ---- reading -----------------------------------------------------------------------------

    def _mismatch(self, metadata: dict[str, str]) -> str | None:
        if metadata.get("mlxserve_prefix_cache") != FORMAT:
            return "not an mlxserve prefix-cache file of this format"
        if metadata.get("version") != self.version:
            return f"written by mlxserve {metadata.get('version')}, this is {self.version}"
        if metadata.get("fingerprint") != self.fingerprint:
            return "written for another model"
        return None

    def _read(self, segment: Segment) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        """The segment's arrays (numpy; bfloat16 as its bits in uint16) and metadata, checked;
        None (the file removed, with a log line) where they are not what its metadata says."""
        try:
            arrays, metadata = load_safetensors(segment.path)
            problem = self._mismatch(metadata)
            if problem is None and (
                metadata.get("parent") != segment.parent
                or not np.array_equal(tokens_of(metadata["tokens"]), segment.tokens)
            ):
                problem = "its tokens are not those of its index entry"
            if problem is None and checksum(arrays) != metadata.get("checksum"):
                problem = "its arrays do not match their checksum (corrupt)"
            if problem is None and any(a.shape[2] != len(segment.tokens) for a in arrays.values()):
                problem = "its KV does not hold as many positions as its tokens"
        except FileNotFoundError:
            self._forget(segment.key)
            return None
        except Exception as error:  # a file cut short or damaged fails in many ways
            problem = f"unreadable ({type(error).__name__}: {error})"
        if problem is not None:
            log.warning("prefix cache: ignoring %s: %s", segment.path, problem)
            self._forget(segment.key, remove=True)
            return None
        return arrays, metadata

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
                metadata = read_header(path).get("__metadata__", {})
                problem = self._mismatch(metadata)
                if problem is None:
                    tokens = tokens_of(metadata["tokens"])
                    key = segment_key(metadata["parent"], tokens)
                    if path.name != self._name(key):
                        problem = "its name is not its tokens' hash"
            except Exception as error:
                problem = f"unreadable ({type(error).__name__}: {error})"
            if problem is not None:
                log.warning("prefix cache: ignoring %s: %s", path, problem)
                continue
            self._add(Segment(key, metadata["parent"], tokens, path))
        if self._segments:
            log.info(
                "prefix cache on disk: %d segments for this model in %s",
                len(self._segments),
                self.folder,
            )

    def _covered(self, parent: str, tokens: np.ndarray) -> bool:
        """Whether a segment after `parent` holds `tokens` and maybe more (a prompt's last
        segment, shorter than one on disk: its KV is that one's, cut short)."""
        with self._lock:
            siblings = list(self._children.get(parent, {}).values())
        return any(_starts_with(s.tokens, tokens) for s in siblings)

    def _name(self, key: str) -> str:
        return f"{self._prefix}-{key[:32]}{SUFFIX}"

    def _add(self, segment: Segment) -> None:
        self._segments[segment.key] = segment
        self._children[segment.parent][segment.key] = segment

    def _forget(self, key: str, remove: bool = False) -> None:
        with self._lock:
            segment = self._segments.pop(key, None)
            if segment is not None:
                self._children[segment.parent].pop(key, None)
        if remove and segment is not None:
            segment.path.unlink(missing_ok=True)

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
                    due = waiting[0].queued + DEBOUNCE_S - time.monotonic()
                    job = self._jobs.get(timeout=max(0.001, due))
                else:
                    job = self._jobs.get()
            except queue.Empty:
                job = None
            if job is not None:
                waiting = [w for w in waiting if not _supersedes(job.tokens, w.tokens)]
                waiting = [*waiting[-(MAX_QUEUED - 1) :], job]
                continue
            for due_job in [w for w in waiting if stopping or _due(w)]:
                waiting.remove(due_job)
                if not self.writable:
                    continue
                try:
                    for piece in due_job.pieces:
                        self._write(due_job, piece)
                    self._evict()
                except Exception:  # never the writer's end: memory goes on without it
                    log.exception("prefix cache: writing to %s failed", self.folder)
                    self.writable = False
            if stopping and self._jobs.empty():
                return

    def _write(self, job: _Job, piece: _Piece) -> None:
        if piece.key in self._segments or not self.writable:
            return
        start = piece.start - job.low  # in the job's copies
        end = start + len(piece.tokens)
        arrays = {}
        for i, (keys, values) in enumerate(job.views):
            arrays[f"k.{i}"] = np.ascontiguousarray(keys[..., start:end, :])
            arrays[f"v.{i}"] = np.ascontiguousarray(values[..., start:end, :])
        metadata = {
            "mlxserve_prefix_cache": FORMAT,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "parent": piece.parent,
            "start": str(piece.start),
            "tokens": tokens_text(piece.tokens),
            "checksum": checksum(arrays),
            **(job.packing or {}),
        }
        final = self.folder / self._name(piece.key)
        temp = self.folder / f".tmp-{os.getpid()}-{next(self._temp_names)}{SUFFIX}"
        try:
            save_safetensors(temp, arrays, job.dtype, metadata)
            os.replace(temp, final)
        except OSError as error:
            temp.unlink(missing_ok=True)
            self.writable = False
            log.warning(
                "prefix cache: writing to %s failed (%s); it stays in memory from now on",
                self.folder,
                error,
            )
            return
        self.written += 1
        with self._lock:
            # a shorter last segment of an earlier prompt that this one repeats is of no use
            siblings = list(self._children.get(piece.parent, {}).values())
            covered = [
                s
                for s in siblings
                if len(s.tokens) < len(piece.tokens)
                and _starts_with(piece.tokens, s.tokens)
                and not self._children.get(s.key)
            ]
            self._add(Segment(piece.key, piece.parent, piece.tokens, final))
        for segment in covered:
            self._forget(segment.key, remove=True)

    def _evict(self) -> None:
        """Over the budget, remove the least recently used of the folder's files we name (any
        model's), this model's only where no segment follows them: a chain's end goes first,
        the prefix it shares with others last."""
        files = {p.name: p for p in self.folder.iterdir() if OUR_NAME.fullmatch(p.name)}
        sizes = {name: _size(path) for name, path in files.items()}
        total = sum(sizes.values())
        if total <= self.max_bytes:
            return
        with self._lock:
            by_name = {self._name(s.key): s for s in self._segments.values()}
            leaves = [
                name
                for name in files
                if name not in by_name or not self._children.get(by_name[name].key)
            ]
        heap = [(_mtime(files[name]), name) for name in leaves]
        heapq.heapify(heap)
        while heap and total > self.max_bytes:
            _, name = heapq.heappop(heap)
            segment = by_name.get(name)
            if segment is not None:
                self._forget(segment.key)
                parent = self._segments.get(segment.parent)
                if parent is not None and not self._children.get(parent.key):
                    heapq.heappush(heap, (_mtime(parent.path), parent.path.name))
            files[name].unlink(missing_ok=True)
            total -= sizes[name]


def _due(job: _Job) -> bool:
    return time.monotonic() >= job.queued + DEBOUNCE_S


def _starts_with(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    return len(tokens) >= len(prefix) and common_prefix(tokens, prefix) == len(prefix)


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
