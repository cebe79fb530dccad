"""One model's engine: its inbox, its batch of live sequences, and its step.

HTTP handlers call `submit`, which hands a group of GenerationRequests to the engine through a
thread-safe inbox and yields GenerationEvents that the engine thread posts back onto the
caller's event loop. Leaving the iterator early (a client that disconnects) cancels the group
at the next step. Every engine's steps run on one `EngineThread` (scheduling/thread.py), in
turn with the other models' engines; the model's life is `ModelSlot`'s, a group's way into the
batch `Admission`'s, a sequence's state `SequenceState`'s, lock-step across ranks `LockStep`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..planning.model_facts import ROW_ISOLATION, SPECULATION
from ..platform import current_policy
from ..settings import DEFAULT_MAX_STREAM_GAP, SpeculationSettings
from ..speculation.draft_model import ModelDrafter
from ..speculation.pass_costs import DraftModelPassCosts, FlatPassCosts, PassCosts
from ..speculation.planner import DraftPlanner, DraftTotals
from .admitted import AdmittedWork
from .cluster.doorbell import Doorbell
from .cluster.lockstep import Cluster, LockStep, follow
from .embedding_jobs import EMBEDDING_KINDS, EmbeddingQueue, EmbedJob
from .failures.recovery import FailedSteps
from .mlx_lm_compat import ServerBatchGenerator, failed_step
from .models.draft import with_draft_model
from .models.host import LoadedModel, load_model, model_id_for
from .models.slot import LoadModel, ModelSlot, UnloadModel
from .models.sources import ModelLoadError
from .prefix.disk import default_budget_bytes as default_disk_budget_bytes
from .prefix.keeper import PrefixKeeper
from .prefix.memory import default_budget_bytes
from .requests import GenerationEvent, GenerationRequest, RunningSlot, token_rounds
from .scheduling.inbox import Inbox
from .scheduling.messages import (
    Add,
    Cancel,
    Group,
    ImagesRead,
    ModelChanged,
    Prefetched,
    Stop,
    posted_together,
)
from .scheduling.pacing import MAX_CHUNK, PrefillPacer, chunk_cost, spare_the_join
from .scheduling.thread import EngineThread
from .sequences.admission import Admission
from .sequences.live import LiveSequences
from .sequences.state import SequenceState, read_logprob_rows
from .states import LOADING_STATES, EmbeddingFailed, EngineError
from .stats import EngineStats, RateMeter

log = logging.getLogger("mlxserve.engine")

# mlx-lm keeps freed buffers for reuse; return them to the system now and then.
CLEAR_CACHE_EVERY = 256
# MLX's cache of freed buffers is dropped at those steps only past this: dropped, the batch's next
# buffers are new pages, which stalled a stream's step at a prompt's join (docs/benchmarks.md,
# vision.py); a long prompt's chunks leave far more than the batch's steps reuse
RELEASE_CACHE_BYTES = 256 << 20
# ...and malloc's free pages go back to the system every this many steps (on the CPU): trimmed
# at every cache release, a prompt's join beside a stream took its memory as new pages, a step
# many times a decode step's (docs/benchmarks.md, vision.py)
TRIM_EVERY = 4096
READY_POLL_S = 0.05  # how often a request waiting for a load looks whether it is done


def _not_reloadable(slot: ModelSlot) -> bool:
    """Loading, failed or stopped: nothing for a request to load again."""
    return slot.state in LOADING_STATES or slot.state in ("error", "stopped")


def _slot_attribute(name: str) -> property:
    return property(lambda engine: getattr(engine.slot, name), doc=f"The model slot's {name}.")


class Engine(AdmittedWork):
    """One model, one batch; its steps run on an `EngineThread`, in turn with other models'."""

    def __init__(
        self,
        model_source: str,
        on_fatal: Callable[[str], None] | None = None,
        prefix_cache_bytes: int | None = None,
        fim_template: str | None = None,
        idle_unload_s: float | None = None,
        cluster: Cluster | None = None,
        rank_timeout_s: float = 60.0,
        max_stream_gap: float | None = DEFAULT_MAX_STREAM_GAP,
        prefix_cache_dir: Path | None = None,
        prefix_cache_disk_bytes: int | None = None,
        kv_bits: int | None = None,
        kv_group_size: int = 64,
        thread: EngineThread | None = None,
        name: str | None = None,
        loader: Callable[..., LoadedModel] | None = None,
        speculation: SpeculationSettings | None = SpeculationSettings(),  # noqa: B008 - frozen
    ):
        """`thread`: the thread this engine takes its turns on, with other models' engines
        (None: one of its own). `name`: what clients call the model (None: from its source).
        `loader`: loads it in place of `model_host.load_model` (an adapter on its base's
        weights). `prefix_cache_bytes`: the prefix KV cache's budget (None: from the
        machine's memory, 0: no prefix cache). `prefix_cache_dir`: where long prompts' KV is
        kept for a restarted server (None: nowhere), within `prefix_cache_disk_bytes` (None:
        from the disk's free space). `kv_bits`: the KV caches quantized to 4 or 8 bits in
        groups of `kv_group_size` (None: the model's dtype). `fim_template`: force a FIM
        template by name (None: detect). `idle_unload_s`: free the model after this long
        without work (None: never). `max_stream_gap`: a running stream's longest gap while
        prompts prefill beside it, in times its usual gap (None: prefill as fast as it
        can). `speculation`: prompt-lookup drafting (None or 0 drafts: off; off too over
        ranks, whose passes must be alike, and with quantized KV, which is not rolled back)."""
        self.chunk_cost = chunk_cost(max_stream_gap)
        self.policy = current_policy()
        self.policy.limit_malloc_arenas()  # before this engine's threads allocate
        self.cluster = cluster  # several ranks in lock-step (None: this process alone)
        distributed = cluster is not None and cluster.size > 1
        self._leader = cluster is None or cluster.leader
        self.lockstep = (
            LockStep(cluster, rank_timeout_s, self._lose_cluster) if distributed else None
        )
        self.stats = EngineStats()
        self._rate = RateMeter()
        drafting = speculation is not None and speculation.runs(distributed, bool(kv_bits))
        self.speculation = speculation if drafting else None
        if drafting and speculation.draft_model is not None:
            loader = with_draft_model(loader or load_model, speculation.draft_model)
        # learnt over the engine's life, across batches
        self.pass_costs = (
            DraftModelPassCosts()
            if self.speculation and self.speculation.draft_model
            else PassCosts()
        )
        self.draft_totals = DraftTotals()
        self._last_decode: tuple[int, int, float] | None = None  # rows, width, start
        budget = default_budget_bytes() if prefix_cache_bytes is None else prefix_cache_bytes
        if distributed:  # each rank holds its shard of the KV: no one file is the whole of it
            prefix_cache_dir = None
        if prefix_cache_dir is not None and prefix_cache_disk_bytes is None:
            prefix_cache_disk_bytes = default_disk_budget_bytes(prefix_cache_dir)
        self.prefixes = PrefixKeeper(
            budget, self.stats, prefix_cache_dir, prefix_cache_disk_bytes or 0
        )
        self.slot = ModelSlot(
            model_source,
            self.policy,
            fim_template,
            # every rank would have to unload and reload together
            idle_unload_s=None if distributed else idle_unload_s,
            cluster=cluster,
            on_loaded=self._model_loaded,
            on_unloaded=self._model_unloaded,
            kv_quantization=(kv_bits, kv_group_size) if kv_bits else None,
            name=name,
            loader=loader,
        )
        if not distributed:  # ranks load in step: no one steps between their slices
            self.slot.between = lambda: self.thread.step_others(self)
        self.generator: ServerBatchGenerator | None = None
        self.embedder: EmbeddingQueue | None = None  # an embedding model's jobs (no generator)
        self._pacer: PrefillPacer | None = None
        self._on_fatal = on_fatal
        self.thread = thread if thread is not None else EngineThread()
        self._inbox = Inbox(self.thread.wake)
        self._ids = itertools.count()
        self.begun = False  # its first load was tried, on the engine thread
        self.others_streaming_s = 0.0  # how long the other models' streams wait for their steps
        self._started = False
        self._stopped = threading.Event()
        self.live = LiveSequences()
        self._failed = FailedSteps(self)  # rows held out of the batch after a step raised
        AdmittedWork.__init__(self)
        self.admission = Admission(self)  # groups on their way into the batch

    # what clients see of the model: the slot's
    state = _slot_attribute("state")
    error = _slot_attribute("error")
    loaded = _slot_attribute("loaded")
    model_source = _slot_attribute("source")
    model_name = _slot_attribute("name")
    loads = _slot_attribute("loads")
    load_progress = _slot_attribute("progress")
    load_error = _slot_attribute("load_error")
    idle_unload_s = _slot_attribute("idle_unload_s")
    default_idle_unload_s = _slot_attribute("default_idle_unload_s")

    # ---- called from any thread -------------------------------------------------------------

    def start(self) -> Engine:
        self.slot.begin_first_load()
        self._started = True
        self.thread.add(self)
        return self

    @property
    def started(self) -> bool:
        return self._started

    @property
    def idle_for_eviction(self) -> bool:
        """No request admitted, in flight or waiting on a model change: unloading it now
        harms nobody."""
        return (
            self.admitted_sequences == 0
            and not self.has_live_sequences
            and self.slot.pending is None
        )

    def keep_loaded(self) -> None:
        """Take back an unload not applied yet (a request came for the model meanwhile)."""
        self.slot.revoke_unload()

    def pin(self, pinned: bool = True) -> None:
        """Keep the model loaded whatever --idle-unload says (or no longer)."""
        self.slot.pinned = pinned
        self._inbox.put(ModelChanged())  # the engine thread's wait for work is timed anew

    def reload(self) -> None:
        """Load its model again (unloaded idle, or to make room)."""
        self.switch(self.slot.source, self.slot.name)

    def wait_ready(self, timeout: float | None = None) -> bool:
        self.slot.ready.wait(timeout)
        return self.slot.state == "ready"

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(Stop())
        if self._started and not self.thread.is_current():
            self._stopped.wait(timeout)
        self.slot.state = "stopped"

    def check_ready(self) -> LoadedModel:
        slot = self.slot
        if slot.state == "ready" and slot.loaded is not None:
            if slot.pending is None or slot.unloading:  # an unload waits for this request
                return slot.loaded
        if slot.state in LOADING_STATES or slot.pending is not None:
            raise EngineError(f"model {slot.source} is loading", "loading")
        raise EngineError(f"engine is {slot.state}: {slot.error or 'no model loaded'}", slot.state)

    def switch(self, source: str, name: str | None = None) -> None:
        """Load `source` in place of the current model. Requests in flight finish on the old
        one first; new ones are refused (503, loading) until the new one is ready. If the new
        one fails to load, the old one is loaded again and `load_error` says why."""
        self._ask(LoadModel(source))
        self.slot.source = source
        self.slot.name = name or model_id_for(source)

    def unload(self) -> None:
        """Free the model once the requests in flight have finished."""
        self._ask(UnloadModel())

    def keep_alive(self, seconds: float | None) -> None:
        """Keep the model loaded for `seconds` without work from now (None: for ever; 0: unload
        once the work in flight ends), until it is next loaded. A distributed server keeps its
        model: every rank would have to unload and reload together."""
        if self.lockstep is not None:
            return
        self.slot.keep_for(seconds)
        self._inbox.put(ModelChanged())  # the engine thread's wait for work is timed anew

    def _ask(self, change) -> None:
        if self.lockstep is not None:
            raise EngineError(
                "a distributed server serves one model: restart it to serve another", self.state
            )
        self.slot.ask(change)
        self._inbox.put(ModelChanged())

    async def ensure_loaded(self, timeout: float) -> None:
        """A request's wait for the model, up to `timeout`: the first load at start-up, or a
        switch under way, is waited for; an unloaded one (idle, or unloaded by the admin route)
        is loaded again. Clients give up on a 503 within seconds (the openai client's retries
        take 4.5 s) while a first load takes a minute on some machines. An engine not started,
        failed or stopped is not waited for."""
        slot = self.slot
        if slot.unloading and slot.state == "ready":
            return  # still loaded: this request runs first, the unload once it ends
        unloaded = slot.loads > 0 and slot.loaded is None and slot.pending is None
        if unloaded and not _not_reloadable(slot):
            self.switch(slot.source)  # unloaded, or being unloaded: loaded again next
        if slot.state in ("starting", "error", "stopped") or slot.ready.is_set():
            return
        # Polled, not a thread each: a crowd of waiting requests must not take every worker
        # thread of the event loop (planning and grammar compiling run on them).
        deadline = time.monotonic() + timeout
        while not slot.ready.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(READY_POLL_S)

    def memory_bytes(self) -> int:
        """Memory MLX holds now: weights, KV caches, buffers."""
        return int(mx.get_active_memory())

    def current_tokens_per_second(self) -> float:
        """The recent generation rate; 0 once nothing was generated for a few seconds."""
        return 0.0 if self._rate.idle() else self.stats.tokens_per_second

    def stopping_soon(self, rank_timeout_s: float = 5.0) -> None:
        """A stop signal came: under --distributed, a step that waits `rank_timeout_s` on the
        other ranks means one is gone (mlx.launch stops rank 0 when another rank dies): the
        requests in flight get a 503 then, not a drain that waits on a lost rank."""
        if self.lockstep is not None:
            self.lockstep.hurry(rank_timeout_s)

    def follow(self) -> int:
        """The loop of a rank other than 0 (engine/cluster/lockstep.py); the process's exit code."""
        return follow(self)

    async def submit(
        self, requests: Sequence[GenerationRequest], reservation: int | None = None
    ) -> AsyncIterator[GenerationEvent]:
        """Generate a group of sequences; events carry the request's index in the group.
        `reservation`: `reserve`'s, now counted as submitted.

        Stop iterating (or get cancelled) to cancel whatever is still running.
        """
        self.release(reservation)
        self.check_ready()
        group = Group(next(self._ids), list(requests), asyncio.get_running_loop(), asyncio.Queue())
        remaining = len(group.requests)
        with self.counted(requests):
            self.add_group(group)
            try:
                while remaining:
                    event: GenerationEvent = await group.events.get()
                    if event.finished:
                        remaining -= 1
                    yield event
            finally:
                if remaining:
                    self.cancel_group(group.group_id)

    async def embed(
        self, rows: list[list[int]], seconds: list[int] | None = None, per_token: bool = False
    ) -> np.ndarray | list[np.ndarray]:
        """One vector a row of token ids (float32, (len(rows), dimensions)), from an embedding
        model; a reranker's scores, (len(rows), 1), of pairs whose second text starts at
        `seconds[i]`; `per_token`: each row's (len(row), dimensions) hidden states, unpooled.
        Raises EmbeddingFailed."""
        loaded = self.check_ready()
        if loaded.kind not in EMBEDDING_KINDS or (per_token and loaded.kind != "embed"):
            raise EmbeddingFailed(f"{self.model_name} is not an embedding model")
        loop = asyncio.get_running_loop()
        rows = [list(row) for row in rows]
        job = EmbedJob(rows, loop, loop.create_future(), seconds, per_token)
        self._inbox.put(job)
        return await job.future

    def add_group(self, group: Group) -> None:
        """Hand a group to the engine thread (`submit`'s, or the front process's through
        ipc/engine_main.py, whose events go to the group's sink)."""
        self._inbox.put(Add(group))

    def cancel_group(self, group_id: int) -> None:
        self._inbox.put(Cancel(group_id))

    async def running_slots(self) -> list[RunningSlot]:
        """The batch's sequences as llama.cpp's GET /slots shows them."""
        return [
            RunningSlot(seq.slot, group_id, seq.request, seq.generated, seq.lines.seen_newline)
            for group_id, seq in self.live.snapshot()
        ]

    def keep_alive_until(self) -> float | None:
        """When (time.monotonic(), the same clock in every process) an idle unload is due;
        None: never (pinned, or no --idle-unload)."""
        slot = self.slot
        idle = None if slot.pinned else slot.idle_unload_s
        return None if idle is None else slot.last_work + idle

    def keep_alive_left_s(self) -> float | None:
        """Seconds until an idle unload (None: never)."""
        until = self.keep_alive_until()
        return None if until is None else until - time.monotonic()

    # ---- the engine thread ------------------------------------------------------------------

    @property
    def has_live_sequences(self) -> bool:
        return len(self.live) > 0 or self._failed.busy

    @property
    def _busy(self) -> bool:
        embedding = self.embedder is not None and len(self.embedder) > 0
        return self.has_live_sequences or self.admission.busy or embedding

    # ---- the engine thread's turns (scheduling/thread.py) -------------------------------------

    def begin(self) -> bool:
        """The first load (and, distributed, the watchdog and the doorbell); False when it
        failed and this engine is done."""
        slot = self.slot
        self.begun = True
        try:
            slot.load(slot.source)
        except ModelLoadError as error:
            self._fail(str(error))
            self._stopped.set()
            return False
        if self.lockstep is not None:
            self.lockstep.start_watchdog(lambda: slot.state in ("error", "stopped"))
            try:
                self.lockstep.doorbell = Doorbell.open(self.cluster, on_gone=None)
            except Exception as error:
                self._lose_cluster(error)
                self._stopped.set()
                return False
        return True

    @property
    def idle(self) -> bool:
        """Nothing to do until a message comes (or the idle unload is due)."""
        return not self._busy and self.slot.pending is None and not self.admission.adopting

    def idle_wait(self) -> float | None:
        return self.slot.idle_wait(self._busy)

    def before_sleep(self) -> None:
        """Every engine on the thread is idle: what waits for a quiet moment is done now."""
        self.prefixes.hand_over(everything=True)
        if self.lockstep is not None:
            self.lockstep.sleep()  # the other ranks wait on the doorbell meanwhile

    def streaming_step_s(self) -> float:
        """How long this model's streams wait for its step (0 while none decodes): the other
        models' prefill chunks add to that wait."""
        generator, pacer = self.generator, self._pacer
        if generator is None or pacer is None or not generator.decode_batch.uids:
            return 0.0
        return pacer.decode_step_s or 0.0

    def turn(self) -> bool:
        """This engine's share of a round: take its messages, apply a model change or an idle
        unload, step its batch once. False once it is asked to stop."""
        slot = self.slot
        try:
            running = self._drain_inbox()
        except Exception as error:
            if self.lockstep is not None:  # the distributed tick failed
                self._lose_cluster(error)
                return False
            log.exception("admitting or cancelling requests failed")
            self._fail_all(f"generation failed: {error}")
            return True
        if not running:
            return False
        if self._busy or self.admission.reading:  # nor under a read
            slot.last_work = time.monotonic()
        elif slot.pending is not None:
            slot.apply_change()
            return True
        elif slot.idle_for_too_long():
            if self.awaiting_submission():  # a request admitted here is on its way: not idle
                slot.last_work = time.monotonic()
            else:
                log.info("idle for %.0f s: unloading %s", slot.idle_unload_s, slot.source)
                slot.unload()
                return True
        self.admission.adopt()
        self._image_step()
        if self.embedder is not None:
            self._embed_step()
            return True
        if not self.has_live_sequences:
            return True
        if self.lockstep is None:
            self.step_now()
            return True
        try:
            with self.lockstep.waiting():
                self.step()
        except Exception as error:  # a rank is gone
            self._lose_cluster(error)
            return False
        return True

    def _image_step(self) -> None:
        """A pass of the oldest prompt with images waiting for its prefill: while streams run,
        no longer than a prompt chunk may take beside their decode step (`chunk_cost`); the
        groups it completes are admitted."""
        if not self.admission.images or self.generator is None:
            return
        step_s = self.streaming_step_s() + self.others_streaming_s
        self.admission.image_step(self.chunk_cost * step_s if step_s > 0 else None)

    def _embed_step(self) -> None:
        """A batch of the embedding jobs; while other models stream, no longer than their
        pacers let a prefill chunk hold them (`chunk_cost` of their decode steps)."""
        if len(self.embedder):
            streaming = self.others_streaming_s
            self.embedder.step(self.chunk_cost * streaming if streaming > 0 else None)

    def step_now(self) -> None:
        """One step of the running sequences (also while another model loads, when its new
        requests wait for the load)."""
        try:
            self.step()
        except Exception as error:  # a broken step must not take the server down
            log.exception("engine step failed")
            self._fail_all(f"generation failed: {error}")

    def finish(self) -> None:
        """Asked to stop: whoever still waits is told so, and the model is let go."""
        if self.embedder is not None:
            self.embedder.fail_all("the server is shutting down")
        if self._busy:  # stopped with work left (a drain's deadline): say so to every client
            self._fail_all("the server is shutting down", unavailable=True)
        self.admission.close("the server is shutting down")
        mx.synchronize()  # no work may outlive this thread's MLX stream (abort at exit)
        self.prefixes.close()
        self.slot.state = "stopped"
        self._stopped.set()

    def _model_loaded(self, loaded: LoadedModel) -> None:
        if loaded.kind in EMBEDDING_KINDS:
            self.embedder = EmbeddingQueue(loaded.model, self.stats)
            return
        self._pacer = PrefillPacer(
            calibrated=loaded.prefill_chunk, cost=self.chunk_cost, pass_s=loaded.decode_step_s
        )
        self.prefixes.positional = not loaded.keeps_checkpoints
        self.prefixes.open_disk(loaded)
        if loaded.draft is not None:
            self.prefixes.open_draft(loaded.draft_kv_share, loaded.draft)
        self.generator = self._new_generator()

    def _model_unloaded(self) -> None:
        if self.embedder is not None:
            self.embedder.fail_all(f"{self.model_name} was unloaded")
        self.admission.fail_images(f"{self.model_name} was unloaded")
        self.generator = self.embedder = None
        self.prefixes.reset()

    def _new_generator(self) -> ServerBatchGenerator:
        """The batch. Its prompt batch runs a chunk in forward passes of the platform's size
        (the same on every rank: collectives of different shapes would pair up wrongly)."""
        loaded = self.slot.loaded
        pass_tokens = self.policy.prompt_pass_tokens or MAX_CHUNK
        spec = self.speculation
        planner = None
        if spec is not None and SPECULATION not in loaded.features_off:
            planner = DraftPlanner(
                spec.draft_tokens,
                spec.ngram_min,
                spec.ngram_max,
                costs=FlatPassCosts() if spec.fixed_width else self.pass_costs,
                totals=self.draft_totals,
                model=None
                if loaded.draft is None
                else ModelDrafter(loaded.draft.model, self.prefixes.draft),
            )
        generator = ServerBatchGenerator(
            loaded.model,
            prefill_chunk=loaded.prefill_chunk,
            pass_tokens=pass_tokens,
            attention=self.policy.attention(),
            matmul_rows=self.policy.matmul_rows(),
            cluster=self.cluster,
            planner=planner,
        )
        self.prefixes.new_batch()
        if generator.mixed is not None:
            self._pacer.beside_decode_max = generator.mixed.max_chunk
            self._pacer.layers = generator.mixed.layers
        return generator

    def _fail(self, message: str) -> None:
        self.slot.fail(message)
        if self._on_fatal:
            self._on_fatal(message)

    def _lose_cluster(self, error: Exception) -> None:
        """A rank is gone (its collective failed): every request in flight gets a 503 and the
        server stops, exiting non-zero; the shards cannot go on without it."""
        message = f"the distributed server lost a rank ({error}); restart it"
        if self.slot.state == "error":  # reported already (by the watchdog or the engine thread)
            return
        log.error(message)
        self._fail_all(message, unavailable=True)
        self._fail(message)

    def _drain_inbox(self) -> bool:
        """Apply queued adds and cancels (on every rank, when distributed). Returns False when
        asked to stop."""
        messages, running = [], True
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, Stop):
                running = False
                break
            if isinstance(message, Add | Cancel | Prefetched | EmbedJob | ImagesRead):
                messages.append(message)
        if self.lockstep is not None:
            prefill = self.generator.prefill_step_size if self.generator is not None else None
            self.lockstep.wake()
            self.lockstep.tick(messages, prefill, stop=not running)
        self.apply(messages)
        return running

    def apply(self, messages: list) -> None:
        """Admit added groups and cancel cancelled ones (rank 0's inbox, or its tick)."""
        for message in messages:
            if isinstance(message, Add):
                self.slot.last_work = time.monotonic()
                self.admission.admit(message.group)
            elif isinstance(message, Cancel):
                self._cancel(message.group_id)
            elif isinstance(message, Prefetched):
                self.admission.prefetched(message)
            elif isinstance(message, ImagesRead):
                self.admission.images_read(message)
            elif isinstance(message, EmbedJob):
                self.slot.last_work = time.monotonic()
                if self.embedder is None:
                    message.settle(error=f"{self.model_name} is not an embedding model")
                else:
                    self.embedder.add(message)
        self.stats.waiting_groups = self._inbox.qsize()

    def step(self) -> None:
        """One step of the batch: a decode pass for every running sequence and the next chunk
        of the prompts being prefilled; then each token becomes an event."""
        generator, pacer = self.generator, self._pacer
        started = time.perf_counter()
        self.prefixes.advance_copies(generator.decode_batch)
        grown = generator.reserve_kv()
        isolates = self.lockstep is None and ROW_ISOLATION not in self.slot.loaded.features_off
        point = failed_step.checkpoint(generator) if isolates else None
        try:
            with generator.stats() as work:
                prompt_responses, responses = generator.next()
        except Exception as error:
            if point is None:
                raise
            self._failed.recover(error, point)
            return
        step_s = time.perf_counter() - started
        self._time_passes(started, work.prompt_tokens, responses)
        # a chunk is paid by the step whose decode pass carried it
        paid = generator.paid_tokens(work.prompt_tokens)
        if self._leader:  # the other ranks run rank 0's chunks (its tick), never their own
            chunk = pacer.observe(
                step_s,
                prompt_tokens=paid,
                prompts=sum(not r.end_of_prompt for r in prompt_responses),
                decoded=bool(responses),
                others_s=self.others_streaming_s,
            )
            # a stream waits on the step a prompt joins in; a chunk spread over passes costs
            # a share of the layers in each, its final one too
            if responses and pacer.layers_per_pass is None:
                chunk = spare_the_join(chunk, generator.prompt_tails())
            generator.prefill_step_size = chunk
            generator.set_layers_per_pass(pacer.layers_per_pass)
        log.debug(
            "step %.1f ms: %d KV layers grown, %d prompt tokens (%.1f computed), %d decoded, "
            "%d prompts ended, next chunk %d (%s layers a pass)",
            step_s * 1000,
            grown,
            work.prompt_tokens,
            paid,
            len(responses),
            sum(r.end_of_prompt for r in prompt_responses),
            generator.prefill_step_size,
            pacer.layers_per_pass or "all",
        )
        self._report_progress(prompt_responses)
        for r in prompt_responses:
            if r.end_of_segment and not r.end_of_prompt:
                self.admission.keep_checkpoint(r.uid)
            if r.end_of_prompt:
                self.admission.keep_running_prompt(r.uid)
                self.admission.release_followers(r.uid)
        if responses:
            self._emit(responses)
        self._failed.passed()

    def _time_passes(self, started: float, prompt_tokens: int, responses) -> None:
        """The step before, timed start to start, to the draft planner's pass costs, when it was
        a decode step alone (no prompt tokens in it)."""
        last, generator = self._last_decode, self.generator
        if last is not None and self.speculation is not None:
            self.pass_costs.observe(last[0], last[1], started - last[2])
        self._last_decode = None
        planner = generator.planner
        joined = planner is not None and planner.model is not None and planner.model.joined
        if responses and not prompt_tokens and not joined:  # (a draft model's prompt read)
            rows = len({r.uid for r in responses})
            self._last_decode = (rows, generator.decode_batch.draft_width, started)

    def _report_progress(self, prompt_responses) -> None:
        """llama.cpp's prompt_progress: to each sequence that asked, how far its prompt is read
        (mlx-lm's prompt responses carry (read, total) of the tokens past the prefix cache)."""
        if not self._leader:
            return
        with posted_together():
            for r in prompt_responses:
                seq = self.live.get(r.uid)
                progress = getattr(r, "progress", None)
                if seq is None or not seq.request.report_progress:
                    continue
                if isinstance(progress, tuple) and len(progress) == 2:
                    seq.post(seq.progress(*progress))

    def _emit(self, responses) -> None:
        """Each decoded token to its sequence, an event each (a sequence's tokens of one step
        reach the front together, in one message), finished sequences removed."""
        stats = self.stats
        stats.decode_steps += 1
        live = [(r, seq) for r in responses if (seq := self.live.get(r.uid)) is not None]
        planner = self.generator.planner if self.generator is not None else None
        if planner is not None and planner.verdicts:
            for uid, (drafted, kept) in planner.take_verdicts().items():
                if (seq := self.live.get(uid)) is not None:
                    seq.drafted += drafted
                    seq.accepted += kept
        rounds = token_rounds(live)
        stats.peak_batch = max(stats.peak_batch, len(rounds[0]) if rounds else 0)
        if stats.decode_steps % CLEAR_CACHE_EVERY == 0:
            # MLX's cache only when it holds much, malloc's free pages seldom: what either gives
            # back, the batch's next buffers take as new pages
            self.policy.release_freed_memory(
                trim=stats.decode_steps % TRIM_EVERY == 0,
                clear_cache=mx.get_cache_memory() > RELEASE_CACHE_BYTES,
            )
        for r, seq in live:
            if r.finish_reason is not None and seq.request.cache_prompt:
                self.prefixes.keep(seq.keyed(r.all_tokens), r.prompt_cache)
        if not self._leader:
            return  # rank 0 decides what ended; its next tick says so
        finished, ended = [], set()
        with posted_together():
            for token_round in rounds:
                logprob_rows = read_logprob_rows(token_round)
                for response, seq in token_round:
                    if seq.uid in ended:
                        continue  # ended by an earlier token of this step (a stop string)
                    event = self._advance(seq, response, logprob_rows.get(id(seq)))
                    stats.generated_tokens += event.error is None
                    seq.post(event)
                    if event.finished:
                        finished.append(seq)
                        ended.add(seq.uid)
        self._remove(finished)
        self._failed.sent(live)
        if self.lockstep is not None:
            self.lockstep.removed += [s.uid for s in finished if s.uid is not None]
        stats.active_sequences = len(self.live)
        stats.tokens_per_second = self._rate.record(stats.generated_tokens)
        stats.drafted_tokens = self.draft_totals.drafted
        stats.accepted_tokens = self.draft_totals.accepted

    def _advance(self, seq: SequenceState, response, row) -> GenerationEvent:
        """The sequence's event for its token; an error event, ending it alone, where its
        sampler, logits processors or detokenizing failed (the batch's other rows go on)."""
        failure = seq.guard.error if seq.guard is not None else None
        if failure is None:
            try:
                return seq.advance(response, row)
            except Exception as error:
                log.exception("a sequence failed in its detokenizer")
                failure = f"detokenizer failed: {type(error).__name__}: {error}"
        self.stats.failed_sequences += 1
        return GenerationEvent(index=seq.index, error=f"generation failed: {failure}")

    def remove_uids(self, uids: list[int]) -> None:
        """Remove the sequences with these batch rows (rank 0's tick on the other ranks)."""
        self._remove([seq for u in uids if (seq := self.live.get(u)) is not None])

    def _remove(self, sequences: list[SequenceState]) -> None:
        """Forget finished or cancelled sequences and free their batch slots.

        mlx-lm already dropped those it finished itself; `remove` ignores uids it no longer holds.
        """
        uids = [s.uid for s in sequences if s.uid is not None]
        if uids:
            keep = {s.uid: s for s in sequences if s.request.cache_prompt}
            caches = self.generator.remove(uids, return_prompt_caches=self.prefixes.enabled)
            for uid, (cache, tokens) in caches.items():
                if uid in keep:
                    self.prefixes.keep(keep[uid].keyed(tokens), cache)
        self.stats.finished_sequences += sum(self.live.forget(seq) for seq in sequences)

    def _cancel(self, group_id: int) -> None:
        self.stats.cancelled_sequences += self.admission.drop_group(group_id)
        self.stats.cancelled_sequences += self._failed.forget_group(group_id)
        members = self.live.group(group_id)
        if members:
            self._remove(members)
            self.stats.cancelled_sequences += len(members)
            self.stats.active_sequences = len(self.live)

    def _fail_all(self, message: str, unavailable: bool = False) -> None:
        self._failed.fail_all(message, unavailable)
        for seq in self.live.all():
            seq.post(GenerationEvent(index=seq.index, error=message, unavailable=unavailable))
        self.admission.fail_all(message, unavailable)
        self.live.clear()
        if self.slot.loaded is not None:
            self.generator = self._new_generator()
        self.stats.active_sequences = 0
