"""What the engine keeps in the prefix cache, and when: prompts copied out of the running batch
a few layers a step, and finished sequences' KV as they leave; long ones on disk too, for a
restarted server. A draft model's KV is kept beside the model's, in memory and on disk."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import trim_prompt_cache

from ..mlx_lm_compat.cache_kinds import detached
from ..stats import EngineStats
from .checkpoint_files import CHECKPOINTS_FOLDER, CheckpointFiles
from .disk import DiskPrefixStore
from .memory import COPY_BUDGET_BYTES, PrefixCache, RunningPromptCopies

log = logging.getLogger("mlxserve.engine")


class PrefixKeeper:
    """The prefix cache of the loaded model (None when its budget is 0) and its running copies."""

    def __init__(
        self,
        budget_bytes: int,
        stats: EngineStats,
        disk_folder: Path | None = None,
        disk_budget_bytes: int = 0,
    ):
        """`disk_folder`: where long prompts' KV is kept across restarts (None: nowhere)."""
        self.budget_bytes = budget_bytes
        self.stats = stats
        self.disk_folder = disk_folder if disk_budget_bytes > 0 else None
        self.disk_budget_bytes = disk_budget_bytes
        self.cache: PrefixCache | None = None
        self.draft: PrefixKeeper | None = None  # the draft model's KV, if it has one
        self.disk: DiskPrefixStore | None = None
        self.checkpoint_files: CheckpointFiles | None = None  # a checkpointing model's, on disk
        self.copies = RunningPromptCopies()
        # every layer keeps positions (cache_kinds.py): running prompts copied a few layers a
        # step, entries on disk; else checkpoints of the whole state, in memory
        self.positional = True
        self.reset()

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    def reset(self) -> None:
        """An empty cache (KV of one model is no use to another); the disk's files stay."""
        self.close()
        self.cache = PrefixCache(self.budget_bytes) if self.budget_bytes > 0 else None
        self.draft = None
        self.copies = RunningPromptCopies()
        self._count()

    def open_draft(self, share: float, draft=None) -> None:
        """A cache for a draft model's KV beside the model's, `share` of its budget (the draft's
        KV per token over the model's: the same tokens fit in both), on disk too where the
        model's is and `draft` (the draft's load) tells its KV from another's. Its counts are
        its own, not the model's."""
        if self.cache is None:
            return
        self.draft = PrefixKeeper(
            max(1, int(self.budget_bytes * share)),
            EngineStats(),
            self.disk_folder,
            self.disk_budget_bytes,
        )
        if self.disk is not None and draft is not None:
            self.draft.open_disk(draft, role="draft")

    def open_disk(self, loaded, role: str = "") -> None:
        """Start reading and writing the `loaded` model's entries on disk (none where there is
        no folder, no memory cache, or nothing to tell this model's KV from another's). `role`:
        what else its KV depends on (a draft's KV lies apart from the same model served)."""
        if self.cache is None or self.disk_folder is None:
            return
        fingerprint = loaded.fingerprint()
        if fingerprint is None:
            return
        if role:
            fingerprint = hashlib.sha256(f"{role}:{fingerprint}".encode()).hexdigest()
        if not self.positional:
            folder = self.disk_folder / CHECKPOINTS_FOLDER
            try:
                self.checkpoint_files = CheckpointFiles(folder, self.disk_budget_bytes, fingerprint)
            except OSError as error:
                log.warning("prefix cache: %s is not usable (%s); memory only", folder, error)
            return
        try:
            self.disk = DiskPrefixStore(self.disk_folder, self.disk_budget_bytes, fingerprint)
        except OSError as error:
            log.warning("prefix cache: %s is not usable (%s); memory only", self.disk_folder, error)

    def close(self) -> None:
        """Write what waits for the disk (a stopping server, a model unloading)."""
        if self.draft is not None:
            self.draft.close()
        if self.checkpoint_files is not None:
            self.checkpoint_files.write_waiting()
            self.checkpoint_files = None
        if self.disk is not None:
            self.disk.close()
            self.disk = None

    def hand_over(self, everything: bool = False) -> None:
        """The disk's writer takes what was kept (a step's share of the copies it needs, or
        `everything` at once while no stream waits)."""
        if self.draft is not None:
            self.draft.hand_over(everything)
        if everything and self.checkpoint_files is not None:
            self.checkpoint_files.write_waiting()
        if self.disk is not None:
            self.disk.hand_over(None if everything else COPY_BUDGET_BYTES)

    def new_batch(self) -> None:
        """The batch was rebuilt: copies of its rows are gone with it."""
        self.copies = RunningPromptCopies()

    def prefetch(self, prompt: list[int], done) -> bool:
        """Start reading from disk what it gives of `prompt` beyond memory, off the engine
        thread; `done(read)` on the reader's thread (then `adopt` it on the engine's). False
        when the disk gives nothing more."""
        if self.disk is None or self.cache is None:
            return False
        found = self.disk.best(prompt, self.cache.covered(prompt))
        if found is None:
            return False
        self.disk.prefetch(*found, done)
        return True

    def adopt(self, read, everything: bool = False) -> bool:
        """Into the memory cache, what a prefetch read (engine thread): a step's share of it
        (a long prompt's KV is a copy that would hold the streams), or `everything` at once
        while none waits. Whether it is all in (or there was nothing to adopt)."""
        if read is None or self.disk is None:
            return True
        loaded = self.disk.adopt(read, None if everything else COPY_BUDGET_BYTES)
        if loaded is None:
            return False
        self.cache.store(read.tokens.tolist(), loaded[0])
        self._count()
        return True

    def fetch(self, prompt: list[int]):
        """(a private copy of the longest cached prefix's KV or None, its length): from memory,
        or from disk where its files give more."""
        cache, reused = self.cache.fetch(prompt, count=False)
        if self.checkpoint_files is not None:
            cache, reused = self._from_checkpoint_files(prompt, cache, reused)
        found = self.disk.best(prompt, reused) if self.disk is not None else None
        read = self.disk.load(*found) if found is not None else None
        if read is not None and read[1] > reused:
            loaded, positions = read
            self.cache.store(prompt[:positions], loaded)
            cache, reused = self.cache.fetch(prompt, count=False)
            target = min(positions, len(prompt) - 1)
            if reused < target:  # over the memory budget: evicted at once
                trim_prompt_cache(loaded, positions - target)
                cache, reused = loaded, target
        self.cache.count(reused)
        self._count()
        return cache, reused

    def _from_checkpoint_files(self, prompt: list[int], cache, reused: int):
        """The longest checkpoint on disk that gives more of `prompt` than memory did, taken
        into memory (read on the engine thread: the request waits for it)."""
        stored = self.checkpoint_files.best(prompt, reused)
        loaded = self.checkpoint_files.load(stored) if stored is not None else None
        if loaded is None:
            return cache, reused
        self.cache.store(prompt[: stored.length], loaded)
        again, more = self.cache.fetch(prompt, count=False)
        return (again, more) if more > reused else (cache, reused)

    def keep(self, tokens, cache) -> None:
        """Store `cache`, the KV of `tokens`; copied out of the batch's buffers now. (None: a
        finished row whose state read drafts past its end, which it cannot give back.)"""
        if self.cache is None or not tokens or cache is None:
            return
        with mx.stream(generation_stream):  # with the model's work (and its collectives)
            mx.async_eval([c.state for c in cache])
            if self.disk is not None:
                self.disk.put(list(tokens), cache)
        if self.checkpoint_files is not None:
            self.checkpoint_files.put(list(tokens), cache)
        self.cache.store(list(tokens), cache)
        self._count()

    def advance_copies(self, decode_batch) -> None:
        """Copy the next layers of running prompts (within a step's byte budget)."""
        self.hand_over()
        with mx.stream(generation_stream):
            for tokens, cache in self.copies.advance(decode_batch):
                self.keep(tokens, cache)

    @property
    def checkpointing(self) -> bool:
        """Prompts are kept as checkpoints of their state, at their segments' ends."""
        return self.cache is not None and not self.positional

    def keep_checkpoint(self, generator, uid: int, keyed) -> None:
        """The state of row `uid`, whose prompt segment just ended, kept under its tokens
        (`keyed`: the row's tokens as the cache keys them). Copied out of the batch now: the
        row goes on from it."""
        if not self.checkpointing:
            return
        for cache, tokens in generator.extract_cache([uid]).values():
            with mx.stream(generation_stream):
                self.keep(keyed(list(tokens)), detached(cache))

    def copy_running_prompt(self, decode_batch, uid: int, tokens: list[int], now: bool) -> None:
        """Start copying a prompt that just joined the decode batch; all at once when `now`
        (choices waiting for it start from it this step). Not where the cache holds it already
        (a prompt that started from the cache, but for its last token or two)."""
        if self.cache is None or not self.positional:  # kept as a checkpoint already
            return
        if not now and self.cache.covered(tokens) >= len(tokens) - 2:
            return
        self.copies.start(uid, tokens)
        if now:
            for done_tokens, cache in self.copies.finish(decode_batch, uid):
                self.keep(done_tokens, cache)

    def _count(self) -> None:
        cache, stats = self.cache, self.stats
        if cache is None:
            stats.prefix_cache_bytes = 0
            return
        stats.prefix_lookups = cache.lookups
        stats.prefix_hits = cache.hits
        stats.prefix_reused_tokens = cache.reused_tokens
        stats.prefix_cache_bytes = cache.nbytes
        if self.disk is not None:
            stats.prefix_disk_entries = self.disk.entries
            stats.prefix_disk_loads = self.disk.loaded
        elif self.checkpoint_files is not None:
            stats.prefix_disk_entries = self.checkpoint_files.entries
            stats.prefix_disk_loads = self.checkpoint_files.loaded
