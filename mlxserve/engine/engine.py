"""The engine thread: owns the model and every MLX call, batches all live sequences.

HTTP handlers call `submit`, which hands a group of GenerationRequests to the thread through a
thread-safe inbox and yields GenerationEvents that the thread posts back onto the caller's event
loop. Leaving the iterator early (a client that disconnects) cancels the group at the next step.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences, generation_stream
from mlx_lm.models.cache import make_prompt_cache

from ..sampling.chain import SequenceSampler, make_processors
from ..sampling.grammar_mask import GrammarMask
from ..sampling.logprobs import LogprobReader, LogprobRow
from ..text import IncrementalDetokenizer, LineRules, StopMatcher
from . import batch_join, mixed_batch
from .distributed import Cluster, broadcast_sampled_tokens
from .kv_reserve import reserve_for_generator
from .memory import limit_malloc_arenas, release_freed_memory
from .model_host import LoadedModel, ModelLoadError, load_model, model_id_for
from .pacing import PrefillPacer, pass_tokens, prompt_tails, spare_the_join
from .prefix_cache import PrefixCache, RunningPromptCopies, default_budget_bytes
from .requests import GenerationEvent, GenerationRequest, Timings, TokenLogprob, kv_tokens

log = logging.getLogger("mlxserve.engine")

EngineState = Literal["starting", "loading", "ready", "unloaded", "error", "stopped"]
PREFILL_STEP = 512
MAX_BATCH = 32
# mlx-lm keeps freed buffers for reuse; return them to the system now and then.
CLEAR_CACHE_EVERY = 256
RATE_WINDOW_S = 5.0


class EngineError(Exception):
    """The engine cannot take work now (not loaded, failed, stopped)."""

    def __init__(self, message: str, state: EngineState):
        super().__init__(message)
        self.state = state


@dataclass
class EngineStats:
    decode_steps: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    finished_sequences: int = 0
    cancelled_sequences: int = 0
    active_sequences: int = 0
    peak_batch: int = 0
    waiting_groups: int = 0
    prefix_lookups: int = 0
    prefix_hits: int = 0
    prefix_reused_tokens: int = 0
    prefix_cache_bytes: int = 0
    tokens_per_second: float = 0.0  # generated, over the last RATE_WINDOW_S seconds


@dataclass
class _Sequence:
    """The engine thread's state for one live sequence."""

    index: int
    request: GenerationRequest
    post: Callable[[GenerationEvent], None]
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    lines: LineRules
    logprob_reader: LogprobReader | None
    prefill_only: bool = False  # max_tokens 0: prefilled for the prefix cache, nothing generated
    uid: int | None = None
    generated: int = 0
    cumulative_logprob: float = 0.0
    cached_tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    def timings(self) -> Timings:
        now = time.monotonic()
        first = self.first_token_at if self.first_token_at is not None else now
        return Timings(
            prompt_tokens=len(self.request.prompt_ids) - self.cached_tokens,
            cached_tokens=self.cached_tokens,
            prompt_ms=(first - self.started) * 1000,
            generated_tokens=self.generated,
            decode_ms=(now - first) * 1000,
        )


@dataclass
class _Group:
    group_id: int
    requests: Sequence[GenerationRequest]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue


@dataclass
class _Follower:
    """A choice whose prompt another choice of its group is prefilling."""

    group: _Group
    index: int
    request: GenerationRequest
    post: Callable[[GenerationEvent], None]


class Engine:
    """One model, one thread, one batch."""

    def __init__(
        self,
        model_source: str,
        on_fatal: Callable[[str], None] | None = None,
        prefix_cache_bytes: int | None = None,
        fim_template: str | None = None,
        idle_unload_s: float | None = None,
        cluster: Cluster | None = None,
        rank_timeout_s: float = 60.0,
    ):
        """`prefix_cache_bytes`: the prefix KV cache's budget (None: from the machine's memory,
        0: no prefix cache). `fim_template`: force a FIM template by name (None: detect).
        `idle_unload_s`: free the model after this long without work (None: never)."""
        if cluster is None:  # see engine/memory.py for why not under mlx.launch
            limit_malloc_arenas()  # before this engine's threads allocate
        self.model_source = model_source  # the model loaded, or being loaded
        self.cluster = cluster  # several ranks in lock-step (None: this process alone)
        self._leader = cluster is None or cluster.leader
        self._removed_uids: list[int] = []  # rank 0: ended by its own rules since the last tick
        self._sent_prefill: int | None = None
        # A lost rank can leave a collective waiting for ever: rank 0 gives a step this long.
        self.rank_timeout_s = rank_timeout_s
        self._waiting_on_ranks_since: float | None = None
        if cluster is not None and cluster.size > 1:
            idle_unload_s = None  # every rank would have to unload and reload together
        self.model_name = model_id_for(model_source)  # the name clients use for it
        self.loaded_name = self.model_name  # the name of the model loaded last
        self.fim_template = fim_template
        self.idle_unload_s = idle_unload_s
        self._prefix_budget = (
            default_budget_bytes() if prefix_cache_bytes is None else prefix_cache_bytes
        )
        self._prefix = PrefixCache(self._prefix_budget) if self._prefix_budget > 0 else None
        self.loading_since: float | None = None
        self.load_error: str | None = None  # the last switch that failed (the old model stayed)
        self.loads = 0  # models loaded so far, the first one included
        self._pending_model: tuple[str, ...] | None = None  # ("load", source) or ("unload",)
        self._last_work = time.monotonic()
        self.state: EngineState = "starting"
        self.error: str | None = None
        self.loaded: LoadedModel | None = None
        self._mixed: mixed_batch.MixedBatches | None = None  # of the current generator
        self._prompt_copies = RunningPromptCopies()  # of the current generator's decode batch
        self.stats = EngineStats()
        self._on_fatal = on_fatal
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="mlxserve-engine", daemon=True)
        self._ready = threading.Event()
        self._groups: dict[int, list[_Sequence]] = {}
        # Submitted and not finished, counted on the event loop's thread (admission control).
        self.pending_sequences = 0
        self.pending_kv_tokens = 0
        self._by_uid: dict[int, tuple[int, _Sequence]] = {}
        # Choices waiting for their leader's prefill (same prompt), by the leader's uid.
        self._followers: dict[int, list[_Follower]] = {}
        self._rate_samples: collections.deque[tuple[float, int]] = collections.deque()

    # ---- called from any thread -------------------------------------------------------------

    def start(self) -> Engine:
        self.state = "loading"
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.state == "ready"

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(("stop",))
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.state = "stopped"

    def check_ready(self) -> LoadedModel:
        if self.state == "ready" and self.loaded is not None and self._pending_model is None:
            return self.loaded
        if self.state in ("starting", "loading") or self._pending_model is not None:
            raise EngineError(f"model {self.model_source} is loading", "loading")
        raise EngineError(f"engine is {self.state}: {self.error or 'no model loaded'}", self.state)

    def switch(self, source: str, name: str | None = None) -> None:
        """Load `source` in place of the current model. Requests in flight finish on the old
        one first; new ones are refused (503, loading) until the new one is ready. If the new
        one fails to load, the old one is loaded again and `load_error` says why."""
        self._request_model(("load", source))
        self.model_source = source
        self.model_name = name or model_id_for(source)

    def unload(self) -> None:
        """Free the model once the requests in flight have finished."""
        self._request_model(("unload",))

    def _request_model(self, change: tuple[str, ...]) -> None:
        if self._distributed:
            raise EngineError(
                "a distributed server serves one model: restart it to serve another", self.state
            )
        self._ready.clear()
        self._pending_model = change
        self._inbox.put(("model",))

    async def ensure_loaded(self, timeout: float) -> None:
        """A request's wait for the model: an unloaded one (idle, or unloaded by the admin
        route) is loaded again; a switch under way is waited for, up to `timeout`. The first
        load at start-up is not waited for: until then requests get 503 (llama.cpp's contract)."""
        if self.loads == 0:
            return
        if self.state == "unloaded" and self._pending_model is None:
            self.switch(self.model_source)
        if not self._ready.is_set():  # cleared by switch / unload until the change is done
            await asyncio.to_thread(self.wait_ready, timeout)

    def memory_bytes(self) -> int:
        """Memory MLX holds now: weights, KV caches, buffers."""
        return int(mx.get_active_memory())

    async def submit(self, requests: Sequence[GenerationRequest]) -> AsyncIterator[GenerationEvent]:
        """Generate a group of sequences; events carry the request's index in the group.

        Stop iterating (or get cancelled) to cancel whatever is still running.
        """
        self.check_ready()
        loop = asyncio.get_running_loop()
        group = _Group(next(self._ids), list(requests), loop, asyncio.Queue())
        group_kv_tokens = kv_tokens(requests)
        self.pending_sequences += len(requests)
        self.pending_kv_tokens += group_kv_tokens
        self._inbox.put(("add", group))
        remaining = len(group.requests)
        try:
            while remaining:
                event: GenerationEvent = await group.events.get()
                if event.finished:
                    remaining -= 1
                yield event
        finally:
            self.pending_sequences -= len(requests)
            self.pending_kv_tokens -= group_kv_tokens
            if remaining:
                self._inbox.put(("cancel", group.group_id))

    # ---- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load(self.model_source)
        except ModelLoadError as error:
            self._fail(str(error))
            return
        if self._distributed:
            threading.Thread(target=self._watch_ranks, name="mlxserve-ranks", daemon=True).start()
        while True:
            idle = not self._busy and self._pending_model is None
            try:
                running = self._drain_inbox(block=idle, timeout=self._idle_wait())
            except Exception as error:  # only the distributed tick can fail here
                if not self._distributed:
                    raise
                self._lose_cluster(error)
                return
            if not running:
                break
            if self._busy:
                self._last_work = time.monotonic()
            elif self._pending_model is not None:
                self._change_model()
                continue
            elif self._idle_for_too_long():
                log.info("idle for %.0f s: unloading %s", self.idle_unload_s, self.model_source)
                self._unload()
                continue
            if not self._by_uid:
                continue
            try:
                self._waiting_on_ranks_since = time.monotonic()
                self._step()
                self._waiting_on_ranks_since = None
            except Exception as error:  # a broken step must not take the server down
                if self._distributed:
                    self._lose_cluster(error)
                    return
                log.exception("engine step failed")
                self._fail_all(f"generation failed: {error}")
        if self._busy:  # stopped with work left (a drain's deadline): say so to every client
            self._fail_all("the server is shutting down", unavailable=True)
        mx.synchronize()  # no work may outlive this thread's MLX stream (abort at exit)
        self.state = "stopped"

    @property
    def _busy(self) -> bool:
        return bool(self._by_uid or self._followers)

    def _load(self, source: str) -> None:
        """Load `source` (raises ModelLoadError, whatever went wrong, in one line)."""
        started = self.loading_since = time.monotonic()
        self.state = "loading"
        log.info("loading model %s", source)
        try:
            self.loaded = load_model(source, self.fim_template, self.cluster)
        except ModelLoadError:
            raise
        except Exception as error:
            raise ModelLoadError(f"could not load model {source}: {error}") from error
        finally:
            self.loading_since = None
        self.model_source = source
        self.loaded_name = self.model_name
        self._pacer = PrefillPacer(calibrated=self.loaded.prefill_chunk)
        self._generator = self._new_generator()
        # Python's full collections walk every object (the server's, the model's, the
        # tokenizer's): 71-85 ms with all threads held, a gap in every stream. Frozen, what
        # is loaded by now is never walked again; a full collection then takes ~0 ms.
        gc.collect()
        gc.freeze()
        self._last_work = time.monotonic()
        self.loads += 1
        self.state = "ready"
        if self._pending_model is None:
            self._ready.set()
        log.info(
            "model %s ready in %.1f s (context %d tokens, prefill chunks of %d tokens)",
            self.loaded.model_id,
            time.monotonic() - started,
            self.loaded.context_length,
            self.loaded.prefill_chunk,
        )

    def _unload(self) -> None:
        """Free the model, its batch and its prefix cache (KV of one model is no use to another)."""
        self.loaded = None
        self._generator = None
        self._prefix = PrefixCache(self._prefix_budget) if self._prefix_budget > 0 else None
        self._count_prefix()
        gc.unfreeze()  # the model's objects were frozen at load (see `_load`)
        gc.collect()
        release_freed_memory(trim=self.cluster is None)
        self.state = "unloaded"

    def _change_model(self) -> None:
        """Apply a switch or unload asked for while requests were in flight, now none are."""
        change, self._pending_model = self._pending_model, None
        previous = self.loaded.path if self.loaded is not None else None
        self._unload()
        if change[0] == "load":
            try:
                self._load(change[1])
                self.load_error = None
            except ModelLoadError as error:
                self.load_error = str(error)
                log.error("%s; going back to %s", error, previous)
                self.model_source = previous or change[1]
                self.model_name = self.loaded_name
                if previous is not None:
                    try:
                        self._load(previous)
                    except ModelLoadError as again:
                        self.error = str(again)
                        self.state = "error"
                else:
                    self.error = str(error)
                    self.state = "error"
        self._ready.set()

    def _idle_wait(self) -> float | None:
        """How long the inbox may block: until the idle unload is due, or for ever."""
        if self.idle_unload_s is None or self.loaded is None or self._busy:
            return None
        return max(0.0, self._last_work + self.idle_unload_s - time.monotonic())

    def _idle_for_too_long(self) -> bool:
        return (
            self.idle_unload_s is not None
            and self.loaded is not None
            and time.monotonic() - self._last_work >= self.idle_unload_s
        )

    def _lose_cluster(self, error: Exception) -> None:
        """A rank is gone (its collective failed): every request in flight gets a 503 and the
        server stops, exiting non-zero; the shards cannot go on without it."""
        message = f"the distributed server lost a rank ({error}); restart it"
        if self.state == "error":  # reported already (by the watchdog or the engine thread)
            return
        log.error(message)
        self._fail_all(message, unavailable=True)
        self._fail(message)

    def _fail(self, message: str) -> None:
        self.state = "error"
        self.error = message
        self._ready.set()
        log.error(message)
        if self._on_fatal:
            self._on_fatal(message)

    def _new_generator(self) -> BatchGenerator:
        batch_join.install()
        if self._distributed:
            broadcast_sampled_tokens(self.cluster)
        generator = BatchGenerator(
            self.loaded.model,
            completion_batch_size=MAX_BATCH,
            prefill_batch_size=8,
            prefill_step_size=self.loaded.prefill_chunk,
        )
        # The generator cuts each step's prompt chunk at its prefill_step_size, which the pacer
        # (and, on the other ranks, rank 0's tick) sets; its prompt batch then runs that chunk in
        # forward passes of its own prefill_step_size, mlx-lm's constructor argument: our
        # calibrated chunk, a few tokens on a CPU (slow passes), and different on each rank
        # (collectives of different shapes: garbage tokens, or a segfault).
        generator._prompt_batch.prefill_step_size = pass_tokens(mx.default_device() == mx.cpu)
        self._mixed = None
        self._prompt_copies = RunningPromptCopies()
        if not self._distributed and mixed_batch.supports(self.loaded.model):
            mixed_batch.install()  # prompt chunks ride in decode steps' forward passes
            self._mixed = mixed_batch.MixedBatches(
                generator, pass_tokens(mx.default_device() == mx.cpu)
            )
            self._pacer.beside_decode_max = self._mixed.max_chunk
            self._pacer.layers = self._mixed.layers
        return generator

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued adds and cancels (on every rank, when distributed). Returns False when
        asked to stop."""
        messages, running = [], True
        while True:
            try:
                message = self._inbox.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                break
            block = False
            if message[0] == "stop":
                running = False
                break
            if message[0] in ("add", "cancel"):
                messages.append(message)
        if self._distributed:
            self._send_tick(messages, stop=not running)
        self._apply(messages)
        return running

    def _apply(self, messages: list) -> None:
        for message in messages:
            if message[0] == "add":
                self._last_work = time.monotonic()
                self._admit(message[1])
            elif message[0] == "cancel":
                self._cancel(message[1])
        self.stats.waiting_groups = self._inbox.qsize()

    # ---- lock-step across ranks (engine/distributed.py) ----------------------------------------

    @property
    def _distributed(self) -> bool:
        return self.cluster is not None and self.cluster.size > 1

    def _send_tick(self, messages: list, stop: bool) -> None:
        """Rank 0, before applying `messages` and stepping: what the other ranks must do the
        same. None (one small collective) when nothing changed."""
        removed, self._removed_uids = self._removed_uids, []
        prefill = self._generator.prefill_step_size if self._generator is not None else None
        plain = [
            ("add", m[1].group_id, list(m[1].requests)) if m[0] == "add" else m for m in messages
        ]
        changed = plain or removed or stop or prefill != self._sent_prefill
        self._sent_prefill = prefill
        self._waiting_on_ranks_since = time.monotonic()
        self.cluster.broadcast(
            {"messages": plain, "removed": removed, "prefill": prefill, "stop": stop}
            if changed
            else None
        )
        self._waiting_on_ranks_since = None

    def _watch_ranks(self) -> None:
        """Rank 0's watchdog: a step or tick stuck past `rank_timeout_s` means a rank is gone
        (the ring backend does not always report it); fail like a reported loss."""
        while self.state not in ("error", "stopped"):
            time.sleep(0.5)
            since = self._waiting_on_ranks_since
            if since is not None and time.monotonic() - since > self.rank_timeout_s:
                self._lose_cluster(
                    TimeoutError(f"no answer from the other ranks for {self.rank_timeout_s:g} s")
                )
                return

    def follow(self) -> int:
        """The loop of a rank other than 0: load the shard, then apply rank 0's ticks and step
        with it until it stops. Returns the process's exit code."""
        try:
            self._load(self.model_source)
        except ModelLoadError as error:
            log.error("%s", error)
            return 1
        while True:
            tick = self.cluster.broadcast()
            if tick is not None:
                gone = [self._by_uid[u][1] for u in tick["removed"] if u in self._by_uid]
                self._remove(gone)
                groups = [
                    ("add", _Group(m[1], m[2], None, None)) if m[0] == "add" else m
                    for m in tick["messages"]
                ]
                self._apply(groups)
                if tick["prefill"] is not None:
                    self._generator.prefill_step_size = tick["prefill"]
                if tick["stop"]:
                    break
            if self._by_uid:
                self._step()
        mx.synchronize()
        return 0

    def _admit(self, group: _Group) -> None:
        def poster(event: GenerationEvent) -> None:
            if group.loop is not None:  # None on ranks other than 0: nobody listens there
                group.loop.call_soon_threadsafe(group.events.put_nowait, event)

        if self.loaded is None:  # unloaded (idle) while this request was on its way: reload
            try:
                self._load(self.model_source)
            except ModelLoadError as error:
                for index in range(len(group.requests)):
                    poster(GenerationEvent(index=index, error=str(error)))
                return

        sequences = []
        leaders: dict[tuple[int, ...], _Sequence] = {}
        try:
            for index, request in enumerate(group.requests):
                leader = leaders.get(request.prompt_ids)
                if leader is not None and leader.uid is not None:
                    # Same prompt as an earlier choice (n, best_of): start from its prefill.
                    follower = _Follower(group, index, request, poster)
                    self._followers.setdefault(leader.uid, []).append(follower)
                    continue
                seq = self._start_sequence(index, request, poster)
                sequences.append(seq)
                if self._shares_prefill(request):
                    leaders[request.prompt_ids] = seq
        except Exception as error:
            log.exception("could not start a sequence")
            self._drop_followers(group.group_id)
            self._remove([s for s in sequences if s.uid is not None])
            for index in range(len(group.requests)):
                poster(GenerationEvent(index=index, error=f"could not start generation: {error}"))
            return
        for seq in sequences:
            self._register(group.group_id, seq)
        self.stats.active_sequences = len(self._by_uid)

    def _register(self, group_id: int, seq: _Sequence) -> None:
        if seq.uid is not None:
            self._groups.setdefault(group_id, []).append(seq)
            self._by_uid[seq.uid] = (group_id, seq)

    def _shares_prefill(self, request: GenerationRequest) -> bool:
        """Whether later choices of the same prompt should wait for this one's prefill."""
        return (
            self._prefix is not None
            and request.cache_prompt
            and not request.prompt_logprobs
            and request.max_tokens > 0
            and len(request.prompt_ids) > 1
        )

    def _release_followers(self, leader_uid: int) -> None:
        """Start the choices that waited for the leader's prompt, now in the prefix cache."""
        for f in self._followers.pop(leader_uid, []):
            try:
                seq = self._start_sequence(f.index, f.request, f.post)
            except Exception as error:
                log.exception("could not start a sequence")
                f.post(GenerationEvent(index=f.index, error=f"could not start generation: {error}"))
                continue
            self._register(f.group.group_id, seq)
        self.stats.active_sequences = len(self._by_uid)

    def _start_sequence(self, index: int, request: GenerationRequest, post) -> _Sequence:
        loaded = self.loaded
        prompt = list(request.prompt_ids)
        self.stats.prompt_tokens += len(prompt)
        reader = (
            LogprobReader(loaded.tokenizer, request.logprobs)
            if request.logprobs is not None
            else None
        )
        seq = _Sequence(
            index=index,
            request=request,
            post=post,
            detokenizer=IncrementalDetokenizer(
                loaded.tokenizer, prompt, skip_special_tokens=request.skip_special_tokens
            ),
            stops=StopMatcher(request.stop.strings, request.stop.include_in_output),
            lines=LineRules(request.stop.min_indent),
            logprob_reader=reader,
        )
        cache, cached_tokens = None, []
        if request.prompt_logprobs:
            cache, prompt_tokens = self._score_prompt(prompt, reader)
            cached_tokens = prompt[:-1]
            post(GenerationEvent(index=index, prompt_tokens=prompt_tokens))
        elif request.cache_prompt and self._prefix is not None:
            cache, reused = self._prefix.fetch(prompt)
            cached_tokens = prompt[:reused]
            seq.cached_tokens = reused
            self._count_prefix()
        if request.max_tokens == 0:
            if not (request.cache_prompt and self._prefix is not None) or request.prompt_logprobs:
                post(GenerationEvent(index=index, finish_reason="length"))
                return seq
            # A warm-up (llama.vim's n_predict 0): prefill for the prefix cache; the one token
            # generated to get there is dropped.
            seq.prefill_only = True
        stop = request.stop
        grammar = request.sampling.grammar
        # With a grammar, the grammar says where the text ends: EOS always stops, and neither
        # ignore_eos nor min_tokens may ban it (the grammar may allow nothing else).
        ignore_eos = stop.ignore_eos and grammar is None
        eos = [] if ignore_eos else list(loaded.eos_token_ids)
        stop_ids = eos + [t for t in stop.token_ids if t not in eos]
        processors = make_processors(
            request.sampling,
            loaded.vocab_size,
            loaded.context_length,
            banned_until=(stop_ids if grammar is None else (), len(prompt), stop.min_tokens),
            always_banned=loaded.eos_token_ids if ignore_eos else (),
            grammar_mask=GrammarMask(
                loaded.grammars.matcher(grammar),
                len(prompt),
                loaded.vocab_size,
                list(loaded.eos_token_ids),
            )
            if grammar is not None
            else None,
        )
        (seq.uid,) = self._generator.insert(
            [prompt[len(cached_tokens) :]],
            max_tokens=[max(request.max_tokens, 1)],
            caches=[cache] if cache is not None else None,
            all_tokens=[cached_tokens],
            samplers=[SequenceSampler(request.sampling, loaded.vocab_size, request.seed)],
            logits_processors=[processors],
            stop_sequences=[StopSequences([[t] for t in stop_ids] or None)],
        )
        return seq

    def _score_prompt(self, prompt: list[int], reader: LogprobReader):
        """Prefill the prompt ourselves to read every prompt token's logprob (echo + logprobs).

        Returns the filled KV cache (all but the last prompt token) so generation goes on from it.
        On mlx-lm's generation stream, with the rest of the model's work (and its collectives).
        """
        with mx.stream(generation_stream):
            return self._score_prompt_here(prompt, reader)

    def _score_prompt_here(self, prompt: list[int], reader: LogprobReader):
        model = self.loaded.model
        cache = make_prompt_cache(model)
        texts = IncrementalDetokenizer(self.loaded.tokenizer, [])
        scored = [TokenLogprob(prompt[0], texts.add(prompt[0]), None)]
        for start in range(0, len(prompt) - 1, PREFILL_STEP):
            chunk = prompt[start : min(start + PREFILL_STEP, len(prompt) - 1)]
            logits = model(mx.array(chunk)[None], cache=cache)[0].astype(mx.float32)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            targets = prompt[start + 1 : start + 1 + len(chunk)]
            rows = LogprobReader.read_rows(logprobs, targets, reader.k)
            for row in rows:
                context = list(texts.ids)
                text = texts.add(row.token_id)
                scored.append(_describe(reader, context + [row.token_id], row, text))
            mx.eval([c.state for c in cache])
        return cache, scored

    def _step(self) -> None:
        started = time.perf_counter()
        with mx.stream(generation_stream):
            for tokens, cache in self._prompt_copies.advance(self._generator._generation_batch):
                self._keep_prefix(tokens, cache)
            grown = reserve_for_generator(self._generator)
        with self._generator.stats() as work:
            prompt_responses, responses = self._generator.next()
        step_s = time.perf_counter() - started
        paid = work.prompt_tokens
        if self._mixed is not None:  # a chunk is paid by the step whose decode pass carried it
            paid = self._mixed.paid_tokens(work.prompt_tokens)
        if self._leader:  # the other ranks run rank 0's chunks (its tick), never their own
            chunk = self._pacer.observe(
                step_s,
                prompt_tokens=paid,
                prompts=sum(not r.end_of_prompt for r in prompt_responses),
                decoded=bool(responses),
            )
            # a stream waits on the step a prompt joins in; a chunk spread over passes costs
            # a share of the layers in each, its final one too (cut to 1 token, it took 30)
            if responses and self._pacer.layers_per_pass is None:
                chunk = spare_the_join(chunk, prompt_tails(self._generator))
            self._generator.prefill_step_size = chunk
            if self._mixed is not None:
                self._mixed.layers_per_pass = self._pacer.layers_per_pass
        log.debug(
            "step %.1f ms: %d KV layers grown, %d prompt tokens (%.1f computed), %d decoded, "
            "%d prompts ended, next chunk %d (%s layers a pass)",
            step_s * 1000,
            grown,
            work.prompt_tokens,
            paid,
            len(responses),
            sum(r.end_of_prompt for r in prompt_responses),
            self._generator.prefill_step_size,
            self._pacer.layers_per_pass or "all",
        )
        for r in prompt_responses:
            if r.end_of_prompt:
                self._keep_running_prompt(r.uid)
                self._release_followers(r.uid)
        if not responses:
            return
        self.stats.decode_steps += 1
        self.stats.peak_batch = max(self.stats.peak_batch, len(responses))
        if self.stats.decode_steps % CLEAR_CACHE_EVERY == 0:
            release_freed_memory(trim=self.cluster is None)
        live = [(r, self._by_uid[r.uid][1]) for r in responses if r.uid in self._by_uid]
        for r, seq in live:
            if r.finish_reason is not None and seq.request.cache_prompt:
                self._keep_prefix(r.all_tokens, r.prompt_cache)
        if not self._leader:
            return  # rank 0 decides what ended; its next tick says so
        scored = [(r, s) for r, s in live if s.logprob_reader is not None]
        logprob_rows = {}
        if scored:
            rows = LogprobReader.read_rows(
                mx.stack([r.logprobs for r, _ in scored]),
                [r.token for r, _ in scored],
                max(s.request.logprobs for _, s in scored),
            )
            logprob_rows = {id(s): row for (_, s), row in zip(scored, rows)}
        finished = []
        for response, seq in live:
            if self._advance(seq, response, logprob_rows.get(id(seq))):
                finished.append(seq)
        self._remove(finished)
        if self._distributed:
            self._removed_uids += [s.uid for s in finished if s.uid is not None]
        self.stats.active_sequences = len(self._by_uid)
        self._update_rate()

    def current_tokens_per_second(self) -> float:
        """The recent generation rate; 0 once nothing was generated for RATE_WINDOW_S."""
        samples = self._rate_samples
        if not samples or time.monotonic() - samples[-1][0] > RATE_WINDOW_S:
            return 0.0
        return self.stats.tokens_per_second

    def _update_rate(self) -> None:
        now, samples = time.monotonic(), self._rate_samples
        samples.append((now, self.stats.generated_tokens))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        (start, first), (end, last) = samples[0], samples[-1]
        self.stats.tokens_per_second = (last - first) / (end - start) if end > start else 0.0

    def _advance(self, seq: _Sequence, response, row) -> bool:
        """Feed one generated token to its sequence; post an event. True when the sequence ends."""
        request = seq.request
        seq.generated += 1
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        self.stats.generated_tokens += 1
        finish = response.finish_reason
        if seq.prefill_only:
            seq.generated = 0
            finish = "length"
        event = GenerationEvent(index=seq.index, completion_tokens=seq.generated)
        if finish == "stop":
            # A stop token (EOS or stop_token_ids) ends the text without adding to it.
            event.text = seq.stops.flush() + seq.detokenizer.flush()
        elif not seq.prefill_only:
            event.token_ids.append(response.token)
            delta = seq.detokenizer.add(response.token)
            if finish == "length":
                delta += seq.detokenizer.flush()
            result = seq.stops.feed(delta, active=seq.generated >= request.stop.min_tokens)
            lines = seq.lines.feed(result.text)
            event.text = lines.text
            if result.stopped:
                finish, event.stopping_word = "stop", result.matched
            elif lines.stopped or self._out_of_time(seq):
                finish = "length"  # llama.cpp's limit stops
            if finish == "length" and not lines.stopped:
                event.text += seq.stops.flush()
            if row is not None:
                seq.cumulative_logprob += row.logprob
                event.tokens.append(_describe(seq.logprob_reader, seq.detokenizer.ids, row, delta))
        event.cumulative_logprob = seq.cumulative_logprob
        event.finish_reason = finish
        if finish is not None:
            event.cached_tokens = seq.cached_tokens
            event.timings = seq.timings()
        seq.post(event)
        return finish is not None

    @staticmethod
    def _out_of_time(seq: _Sequence) -> bool:
        deadline = seq.request.stop.deadline
        if deadline is not None and time.monotonic() > deadline:
            return True
        limit = seq.request.stop.max_predict_ms
        if not limit or not seq.lines.seen_newline or seq.first_token_at is None:
            return False
        return (time.monotonic() - seq.first_token_at) * 1000 > limit

    def _remove(self, sequences: list[_Sequence]) -> None:
        """Forget finished or cancelled sequences and free their batch slots.

        mlx-lm already dropped those it finished itself; `remove` ignores uids it no longer holds.
        """
        uids = [s.uid for s in sequences if s.uid is not None]
        if uids:
            keep = {s.uid for s in sequences if s.request.cache_prompt}
            caches = self._generator.remove(uids, return_prompt_caches=self._prefix is not None)
            for uid, (cache, tokens) in caches.items():
                if uid in keep:
                    self._keep_prefix(tokens, cache)
        for seq in sequences:
            if seq.uid is None or seq.uid not in self._by_uid:
                continue
            group_id, _ = self._by_uid.pop(seq.uid)
            members = self._groups.get(group_id, [])
            if seq in members:
                members.remove(seq)
            if not members:
                self._groups.pop(group_id, None)
            self.stats.finished_sequences += 1

    def _keep_running_prompt(self, uid: int) -> None:
        """A prompt just prefilled is reusable before its sequence ends: any request sharing it
        starts from a copy, taken a few layers per step (`RunningPromptCopies`), or at once when
        its waiting choices (n, best_of) start from it now."""
        entry = self._by_uid.get(uid)
        if self._prefix is None or entry is None or not entry[1].request.cache_prompt:
            return
        batch = self._generator._generation_batch
        if uid not in batch.uids:  # removed meanwhile
            return
        self._prompt_copies.start(uid, batch.tokens[batch.uids.index(uid)])
        if uid in self._followers:
            for tokens, cache in self._prompt_copies.finish(batch, uid):
                self._keep_prefix(tokens, cache)

    def _keep_prefix(self, tokens, cache) -> None:
        if self._prefix is not None and tokens:
            with mx.stream(generation_stream):  # with the model's work (and its collectives)
                mx.async_eval([c.state for c in cache])  # copy out of the batch's KV now
            self._prefix.store(list(tokens), cache)
            self._count_prefix()

    def _count_prefix(self) -> None:
        prefix = self._prefix
        self.stats.prefix_lookups = prefix.lookups
        self.stats.prefix_hits = prefix.hits
        self.stats.prefix_reused_tokens = prefix.reused_tokens
        self.stats.prefix_cache_bytes = prefix.nbytes

    def _drop_followers(self, group_id: int) -> int:
        dropped = 0
        for leader, followers in list(self._followers.items()):
            kept = [f for f in followers if f.group.group_id != group_id]
            dropped += len(followers) - len(kept)
            if kept:
                self._followers[leader] = kept
            else:
                del self._followers[leader]
        return dropped

    def _cancel(self, group_id: int) -> None:
        self.stats.cancelled_sequences += self._drop_followers(group_id)
        members = list(self._groups.get(group_id, []))
        if members:
            self._remove(members)
            self.stats.cancelled_sequences += len(members)
            self.stats.active_sequences = len(self._by_uid)

    def _fail_all(self, message: str, unavailable: bool = False) -> None:
        for members in list(self._groups.values()):
            for seq in members:
                seq.post(GenerationEvent(index=seq.index, error=message, unavailable=unavailable))
        for followers in self._followers.values():
            for f in followers:
                f.post(GenerationEvent(index=f.index, error=message, unavailable=unavailable))
        self._followers.clear()
        self._groups.clear()
        self._by_uid.clear()
        self._generator = self._new_generator()
        self.stats.active_sequences = 0


def _describe(reader: LogprobReader, ids_with_token, row: LogprobRow, text: str) -> TokenLogprob:
    top = reader.top_alternatives(ids_with_token, row, text)
    return TokenLogprob(row.token_id, text, row.logprob, top)
