"""The front process's stand-ins for the engines and their pool: the same interface the front
doors use in one process (engine/engine.py, engine/models/pool.py), answered from the engine
process's reports and calls (ipc/schema.py). Admission's counts are the front's own."""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ..engine.admitted import AdmittedWork
from ..engine.models.naming import ServedNames
from ..engine.requests import GenerationEvent, GenerationRequest, RunningSlot
from ..engine.states import LOADING_STATES, EngineError
from ..engine.stats import EngineStats
from ..planning.model_facts import ModelFacts
from .schema import EngineView, FactsWire, PoolView, Submit

if TYPE_CHECKING:
    from .supervisor import EngineSupervisor

log = logging.getLogger("mlxserve.ipc")
START_WAIT_S = 120.0  # a request's wait for a (re)starting engine process, as for a load
READY_POLL_S = 0.05  # how often a request waiting for a load looks whether it is done


class LoadProgressView:
    """The engine's load progress as it was last reported (`LoadProgress.as_dict`)."""

    def __init__(self, progress: dict[str, Any]):
        self._progress = progress

    def as_dict(self) -> dict[str, Any]:
        return dict(self._progress)


class RemoteEngine(AdmittedWork):
    """One engine of the engine process, as the front doors see an `Engine`."""

    def __init__(self, supervisor: EngineSupervisor, view: EngineView):
        self.supervisor = supervisor
        self.view = view
        self.facts: ModelFacts | None = None
        self._facts_key: tuple[int, int] | None = None  # (engine process, load) of `facts`
        self._fetching: tuple[int, int] | None = None
        AdmittedWork.__init__(self)
        self.restarting_because: str | None = None  # the engine process died: why

    # ---- the reported state -----------------------------------------------------------------

    def apply(self, view: EngineView) -> None:
        self.view = view
        self.restarting_because = None
        key = (self.supervisor.generation, view.loads)
        if view.state == "ready" and key not in (self._facts_key, self._fetching):
            self._fetching = key
            asyncio.get_running_loop().create_task(self._fetch_facts(key))

    async def _fetch_facts(self, key: tuple[int, int]) -> None:
        """The loaded model's facts, its tokenizer the engine's own (pickled)."""
        try:
            reply = await self.supervisor.call("facts", self.model_name)
            if reply.value is None:
                return
            wire = msgspec.convert(reply.value, FactsWire)
            tokenizer = await asyncio.to_thread(pickle.loads, wire.tokenizer)
        except Exception as error:  # the engine process died meanwhile, or the model left
            log.debug("facts of %s not fetched: %s", self.model_name, error)
            return
        finally:
            if self._fetching == key:
                self._fetching = None
        self.facts = wire.facts(tokenizer)
        self._facts_key = key

    def engine_gone(self, because: str) -> None:
        """The engine process died: nothing is loaded until the new one says so."""
        self.restarting_because = because

    @property
    def state(self) -> str:
        if self.restarting_because is not None:
            return "restarting"
        if self.view.state == "ready" and self.view.loaded and self.loaded is None:
            return "loading"  # the front reads its facts still
        # (ready and not loaded: an unload frees the memory, then says "unloaded", as in one
        # process)
        return self.view.state

    @property
    def loaded(self) -> ModelFacts | None:
        if self.restarting_because is not None or not self.view.loaded:
            return None
        current = (self.supervisor.generation, self.view.loads)
        return self.facts if self._facts_key == current else None

    @property
    def error(self) -> str | None:
        return self.restarting_because or self.view.error

    model_name = property(lambda self: self.view.name)
    model_source = property(lambda self: self.view.source)
    started = property(lambda self: self.view.started)
    loads = property(lambda self: self.view.loads)
    load_error = property(lambda self: self.view.load_error)
    idle_unload_s = property(lambda self: self.view.idle_unload_s)
    default_idle_unload_s = property(lambda self: self.view.default_idle_unload_s)
    idle_for_eviction = property(lambda self: self.view.idle_for_eviction)

    @property
    def stats(self) -> EngineStats:
        return self.view.stats

    @property
    def load_progress(self) -> LoadProgressView | None:
        progress = self.view.load_progress
        return LoadProgressView(progress) if progress is not None else None

    def memory_bytes(self) -> int:
        return self.supervisor.pool.view.memory_bytes

    def current_tokens_per_second(self) -> float:
        return self.view.tokens_per_second

    def keep_alive_left_s(self) -> float | None:
        until = self.view.keep_alive_until
        return None if until is None else until - time.monotonic()

    async def running_slots(self) -> list[RunningSlot]:
        reply = await self.supervisor.call("slots", self.model_name)
        return msgspec.convert(reply.value or [], list[RunningSlot])

    async def embed(
        self, rows: list[list[int]], seconds: list[int] | None = None, per_token: bool = False
    ) -> np.ndarray | list[np.ndarray]:
        """As `Engine.embed`: one float32 vector a row (or a token), from the engine process."""
        reply = await self.supervisor.call(
            "embed", self.model_name, rows=rows, seconds=seconds, per_token=per_token
        )
        value = reply.value
        vectors = np.frombuffer(value["data"], "<f4").reshape(value["shape"])
        if not per_token:
            return vectors
        return np.split(vectors, np.cumsum([len(row) for row in rows])[:-1])

    # ---- asking the engine -----------------------------------------------------------------

    def unload(self) -> None:
        self.supervisor.call_soon("unload", self.model_name)

    def keep_alive(self, seconds: float | None) -> None:
        self.supervisor.call_soon("keep_alive", self.model_name, seconds=seconds)

    def stopping_soon(self, rank_timeout_s: float = 5.0) -> None:
        self.supervisor.call_soon("stopping_soon", self.model_name)

    def check_ready(self) -> ModelFacts:
        view, loaded = self.view, self.loaded
        if self.state == "ready" and loaded is not None:
            if not view.pending_change or view.unloading:  # an unload waits for this request
                return loaded
        state = self.state
        if state in LOADING_STATES or view.pending_change:
            why = self.restarting_because
            raise EngineError(
                f"model {self.model_source} is {'loading' if why is None else why}",
                "loading" if why is None else "restarting",
            )
        raise EngineError(f"engine is {state}: {self.error or 'no model loaded'}", state)

    async def ensure_loaded(self, timeout: float) -> None:
        """As `Engine.ensure_loaded`; a restarting engine process is waited for as a load."""
        view = self.view
        if view.unloading and self.state == "ready":
            return
        unloaded = view.loads > 0 and not view.loaded and not view.pending_change
        if unloaded and self.state not in ("error", "stopped", *LOADING_STATES):
            await self.supervisor.call("ensure_loaded", self.model_name)
        deadline = time.monotonic() + timeout
        while self._on_its_way() and time.monotonic() < deadline:
            await asyncio.sleep(READY_POLL_S)

    def _on_its_way(self) -> bool:
        """A load (or a restart) under way, or asked for and not begun yet."""
        return self.state in LOADING_STATES or self.view.pending_change and not self.view.unloading

    async def submit(
        self, requests: Sequence[GenerationRequest], reservation: int | None = None
    ) -> AsyncIterator[GenerationEvent]:
        """As `Engine.submit`, through the engine process."""
        self.release(reservation)
        self.check_ready()
        requests = list(requests)
        group_id, events = self.supervisor.open_group(len(requests))
        remaining = len(requests)
        with self.counted(requests):
            self.supervisor.send(Submit(group_id, self.model_name, requests), group_id)
            try:
                while remaining:
                    event: GenerationEvent = await events.get()
                    if event.finished:
                        remaining -= 1
                    yield event
            finally:
                self.supervisor.close_group(group_id, cancel=remaining > 0)


class RemotePool:
    """The engine process's pool, as the front doors see a `ModelPool`."""

    def __init__(self, supervisor: EngineSupervisor, names: ServedNames, view: PoolView):
        self.supervisor = supervisor
        self.names_served = names
        self.aliases = names.aliases
        self.adapters = names.adapters
        self.configured = names.configured
        self.view = view
        self.default_name = view.default_name
        self.budget_bytes = view.budget_bytes
        self.pinned = set(view.pinned)
        self._engines: dict[str, RemoteEngine] = {}
        self.apply(view)

    @property
    def restarts(self) -> int:
        return self.supervisor.restarts

    def apply(self, view: PoolView) -> None:
        self.view = view
        self.default_name = view.default_name
        self.pinned = set(view.pinned)
        for engine_view in view.engines:
            engine = self._engines.get(engine_view.name)
            if engine is None:
                self._engines[engine_view.name] = RemoteEngine(self.supervisor, engine_view)
            engine = self._engines[engine_view.name]
            engine.apply(engine_view)
        names = {e.name for e in view.engines}
        for gone in [n for n in self._engines if n not in names]:
            del self._engines[gone]

    def engine_gone(self, because: str) -> None:
        for engine in self._engines.values():
            engine.engine_gone(because)

    def engine_failed(self, because: str) -> None:
        """The engine process died for good (distributed): every engine in error."""
        for engine in self._engines.values():
            engine.view = msgspec.structs.replace(
                engine.view, state="error", error=because, loaded=False
            )

    @property
    def default(self) -> RemoteEngine:
        return self._engines[self.default_name]

    @property
    def engines(self) -> list[RemoteEngine]:
        return list(self._engines.values())

    def names(self) -> list[str]:
        engines = list(self._engines)
        return list(dict.fromkeys([self.default_name, *engines, *self.configured, *self.adapters]))

    def get(self, name: str) -> RemoteEngine | None:
        return self._engines.get(name)

    def resolve(self, name: str | None, by_source: bool = True) -> str | None:
        residents = {n: e.model_source for n, e in self._engines.items()}
        served = ServedNames(self.default_name, self.configured, self.adapters, (), self.aliases)
        return served.resolve(name, residents, by_source)

    def is_pinned(self, name: str) -> bool:
        return name in self.pinned

    def resident(self) -> list[RemoteEngine]:
        return [e for e in self.engines if e.view.loaded or e.view.state in LOADING_STATES]

    def footprint(self, engine: RemoteEngine) -> int:
        return engine.view.footprint

    def memory_used(self, besides: RemoteEngine | None = None) -> int:
        return sum(self.footprint(e) for e in self.resident() if e is not besides)

    async def acquire(self, name: str, source: str | None = None) -> RemoteEngine:
        """As `ModelPool.acquire`; while the engine process (re)starts, it is waited for."""
        await self.supervisor.wait_started(START_WAIT_S)
        await self.supervisor.call("acquire", name, source=source)
        engine = self._engines.get(name)
        if engine is None:
            raise EngineError(f"model {name} is not served", "error")
        return engine

    def pin(self, name: str, pinned: bool = True) -> None:
        (self.pinned.add if pinned else self.pinned.discard)(name)
        self.supervisor.call_soon("pin", name, pinned=pinned)

    def make_default(self, name: str) -> None:
        self.default_name = name
        self.supervisor.call_soon("make_default", name)

    def stop(self) -> None:
        self.supervisor.stop_engine()
