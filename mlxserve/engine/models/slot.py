"""The active model's life: first load, switch (rolling back on failure), unload, idle unload.

The engine thread calls `load`, `apply_change` and `unload`; any thread may ask for a change or
wait for one. What depends on the model (the batch, the pacer, the prefix cache) is rebuilt by
the engine's `on_loaded` / `on_unloaded` callbacks.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...platform import PlatformPolicy
from ..states import LOADING_STATES, EngineState
from .host import LoadedModel, LoadProgress, load_model, model_id_for
from .sources import ModelLoadError

log = logging.getLogger("mlxserve.engine")

MAX_WAIT_S = 3600.0  # the longest single wait for work; a longer idle unload waits again


@dataclass(frozen=True)
class LoadModel:
    source: str


@dataclass(frozen=True)
class UnloadModel:
    pass


ModelChange = LoadModel | UnloadModel


class ModelSlot:
    """One model at a time, and what clients see of it (name, state, the last error)."""

    def __init__(
        self,
        source: str,
        policy: PlatformPolicy,
        fim_template: str | None = None,
        idle_unload_s: float | None = None,
        cluster=None,
        on_loaded: Callable[[LoadedModel], None] = lambda loaded: None,
        on_unloaded: Callable[[], None] = lambda: None,
        kv_quantization: tuple[int, int] | None = None,
        name: str | None = None,
        loader: Callable[..., LoadedModel] | None = None,
    ):
        self.source = source  # the model loaded, or being loaded
        self.name = name or model_id_for(source)  # the name clients use for it
        self.loaded_name = self.name  # the name of the model loaded last
        self.policy = policy
        self.fim_template = fim_template
        self.default_idle_unload_s = idle_unload_s  # the server's --idle-unload
        self.idle_unload_s = idle_unload_s  # this model's, until it is unloaded (keep_alive)
        self.cluster = cluster
        self.kv_quantization = kv_quantization  # (bits, group size) of the KV, or None
        self.state: EngineState = "starting"
        self.error: str | None = None
        self.load_error: str | None = None  # the last switch that failed (the old model stayed)
        self.loaded: LoadedModel | None = None
        self.loads = 0  # models loaded so far, the first one included
        self.progress: LoadProgress | None = None  # the load under way, phase by phase
        self.pending: ModelChange | None = None  # asked for, applied once no work is in flight
        self.last_work = time.monotonic()
        self.pinned = False  # kept loaded: no idle unload (the pool never unloads it for room)
        self.needed: Callable[[], bool] = lambda: False  # in use elsewhere: no idle unload
        self.ready = threading.Event()
        self._on_loaded = on_loaded
        self._on_unloaded = on_unloaded
        self._loader = loader or load_model
        # Called between slices of a load: the other models' streams step (scheduling/thread.py)
        self.between: Callable[[], None] | None = None

    # ---- the engine thread ------------------------------------------------------------------

    def load(self, source: str) -> None:
        """Load `source` (raises ModelLoadError, whatever went wrong, in one line)."""
        if self.progress is None:  # else the first load's, begun as the engine started
            self.progress = LoadProgress(source)
        progress = self.progress
        self.state = "loading"
        log.info("loading model %s", source)
        try:
            self.loaded = self._loader(
                source,
                self.fim_template,
                self.cluster,
                self.policy,
                progress=progress,
                kv_quantization=self.kv_quantization,
                between=self.between,
            )
        except Exception as error:
            self.progress = None
            if isinstance(error, ModelLoadError):
                raise
            raise ModelLoadError(f"could not load model {source}: {error}") from error
        self.source = source
        if self.name != self.loaded.model_id:  # an adapter, or a switch named by its registry entry
            self.loaded.model_id = self.name
        self.loaded_name = self.name
        self.idle_unload_s = self.default_idle_unload_s
        self._on_loaded(self.loaded)
        # Python's full collections walk every object, with all threads held: a gap in every
        # stream. Frozen, what is loaded by now is never walked again.
        gc.collect()
        gc.freeze()
        self.last_work = time.monotonic()
        self.loads += 1
        self.state = "ready"
        self.progress = None  # only now: until then, clients still see the load under way
        if self.pending is None:
            self.ready.set()
        log.info(
            "model %s ready in %.1f s (context %d tokens, prefill chunks of %d tokens; %s)",
            self.loaded.model_id,
            time.monotonic() - progress.started,
            self.loaded.context_length,
            self.loaded.prefill_chunk,
            self.policy.description,
        )

    def unload(self, then: EngineState = "unloaded") -> None:
        """Free the model and what depends on it; the state is `then` once its memory is free
        ("loading" when another model follows, and from the start)."""
        if then in LOADING_STATES:
            self.state = then
        self.loaded = None
        self._on_unloaded()
        gc.unfreeze()  # the model's objects were frozen at load
        gc.collect()
        self.policy.release_freed_memory(trim=self.cluster is None)
        self.state = then

    def apply_change(self) -> None:
        """Apply the switch or unload asked for, now that no request is in flight. A model that
        fails to load is replaced by the previous one again, and `load_error` says why."""
        change, self.pending = self.pending, None
        previous = self.loaded.path if self.loaded is not None else None
        self.unload(then="loading" if isinstance(change, LoadModel) else "unloaded")
        if isinstance(change, LoadModel):
            try:
                self.load(change.source)
                self.load_error = None
            except ModelLoadError as error:
                self.load_error = str(error)
                log.error("%s; going back to %s", error, previous)
                self.source = previous or change.source
                self.name = self.loaded_name
                if previous is None:
                    self.fail(str(error), quiet=True)
                else:
                    try:
                        self.load(previous)
                    except ModelLoadError as again:
                        self.fail(str(again), quiet=True)
        if self.pending is None:  # else a request asked for the model again meanwhile
            self.ready.set()

    def fail(self, message: str, quiet: bool = False) -> None:
        self.state = "error"
        self.error = message
        self.ready.set()
        if not quiet:
            log.error(message)

    def idle_wait(self, busy: bool) -> float | None:
        """How long the engine may wait for work: until the idle unload is due, or for ever."""
        if self.idle_unload_s is None or self.loaded is None or busy or self._kept():
            return None
        due = max(0.0, self.last_work + self.idle_unload_s - time.monotonic())
        return min(due, MAX_WAIT_S)  # a wait past the OS's timer range would raise

    def idle_for_too_long(self) -> bool:
        return (
            self.idle_unload_s is not None
            and not self._kept()
            and self.loaded is not None
            and time.monotonic() - self.last_work >= self.idle_unload_s
        )

    def _kept(self) -> bool:
        return self.pinned or self.needed()

    # ---- any thread -------------------------------------------------------------------------

    def begin_first_load(self) -> None:
        """Before the engine thread starts: clients see the load under way from now on."""
        self.state = "loading"
        self.progress = LoadProgress(self.source)

    def keep_for(self, seconds: float | None) -> None:
        """Unload after `seconds` without work from now (None: never), until the next load."""
        self.idle_unload_s = seconds
        self.last_work = time.monotonic()

    @property
    def unloading(self) -> bool:
        """An unload is asked for and not applied yet: the model is still there."""
        return isinstance(self.pending, UnloadModel) and self.loaded is not None

    def revoke_unload(self) -> None:
        """Drop an unload not applied yet (the engine thread may have taken it already)."""
        if isinstance(self.pending, UnloadModel):
            self.pending = None
            self.ready.set()

    def ask(self, change: ModelChange) -> None:
        """Note a change for the engine thread, which applies it once the work in flight ends."""
        self.ready.clear()
        self.pending = change
