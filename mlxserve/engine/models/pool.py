"""The resident models: one engine per model, all on one thread, within a memory budget.

Requests route by model name (aliases first). A model not resident loads beside the others
when its weights fit the budget; when they do not, the least recently used models with no work
in flight and no pin are unloaded first, and when none can be, the request gets `NoRoom` (a 503
with Retry-After). A LoRA adapter is a model of its own that shares its base's weights: its
base stays resident while it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...platform import current_policy
from ...registry import read_json
from ..engine import Engine
from ..states import EngineError, NoRoom
from .naming import ServedNames, size_text

log = logging.getLogger("mlxserve.engine")
UNLOAD_POLL_S = 0.02  # how often a load waiting for room looks whether an eviction is done
UNLOAD_WAIT_S = 30.0  # ... and how long it waits for one
NO_ROOM_GRACE_S = 1.0  # ... and one whose last request is ending is waited for this long


@dataclass
class Resident:
    """What the pool knows of one engine: when it was last asked for, whether it is pinned."""

    engine: Engine
    last_used: float
    pinned: bool = False
    estimate_bytes: int = 0  # its weights' memory before it is loaded


def estimate_weight_bytes(source: str) -> int:
    """The memory a model's weights will take, from its files: their size, times what this
    platform's conversion makes of them (MLX's CPU backend runs float32)."""
    folder = Path(source).expanduser()
    files = list(folder.glob("*.safetensors")) if folder.is_dir() else []
    size = sum(f.stat().st_size for f in files)
    if not current_policy().converts_weights:
        return size
    config = read_json(folder / "config.json")
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    if isinstance(bits, int) and bits > 0:
        return size * 32 // bits
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    return size * 2 if dtype in ("float16", "bfloat16") else size


class ModelPool:
    """Every engine of this server by model name; the default answers unnamed requests."""

    def __init__(
        self,
        default: Engine,
        make_engine: Callable[..., Engine],
        budget_bytes: int,
        names: ServedNames | None = None,
    ):
        """`make_engine(source, name, loader=None)`: a new engine on `default`'s thread, not
        started. `names`: the models named at start (loaded on request whatever
        --allow-switch says), the adapters, the pins (never unloaded to make room) and the
        aliases."""
        names = names or ServedNames(default.model_name)
        self.default_name = default.model_name
        self.budget_bytes = budget_bytes
        self.names_served = names
        self.aliases = names.aliases
        self.adapters = names.adapters
        self.configured = names.configured
        self.pinned = set(names.pinned)
        self._make_engine = make_engine
        self._residents: dict[str, Resident] = {
            default.model_name: Resident(
                default,
                time.monotonic(),
                estimate_bytes=estimate_weight_bytes(default.model_source),
            )
        }
        self._first = default  # started and stopped by its owner (the server), not here
        default.pin(default.model_name in self.pinned)
        self._lock: asyncio.Lock | None = None  # loads make room one at a time
        # bases an adapter's load is on its way to (waiting for the base, or for room)
        self._adapters_arriving: Counter[str] = Counter()

    # ---- looking up -------------------------------------------------------------------------

    @property
    def default(self) -> Engine:
        return self._residents[self.default_name].engine

    @property
    def engines(self) -> list[Engine]:
        return [r.engine for r in self._residents.values()]

    def names(self) -> list[str]:
        """Every served model's name: the default, then those with an engine, then the
        configured models and adapters not started yet."""
        engines = [e.model_name for e in self.engines]
        return list(dict.fromkeys([self.default_name, *engines, *self.configured, *self.adapters]))

    def get(self, name: str) -> Engine | None:
        resident = self._residents.get(name)
        return resident.engine if resident is not None else None

    def resolve(self, name: str | None, by_source: bool = True) -> str | None:
        """The name of the model a request's `name` routes to (`ServedNames.resolve`)."""
        residents = {n: r.engine.model_source for n, r in self._residents.items()}
        served = ServedNames(self.default_name, self.configured, self.adapters, (), self.aliases)
        return served.resolve(name, residents, by_source)

    def is_pinned(self, name: str) -> bool:
        return name in self.pinned

    def resident(self) -> list[Engine]:
        """The engines whose model is in memory, or on its way there."""
        return [e for e in self.engines if _holds_memory(e)]

    def memory_used(self, besides: Engine | None = None) -> int:
        return sum(self.footprint(e) for e in self.resident() if e is not besides)

    def footprint(self, engine: Engine) -> int:
        """Its weights' memory: measured once loaded, estimated from its files before (or
        remembered from its last load)."""
        loaded = engine.loaded
        resident = self._residents.get(engine.model_name)
        if loaded is not None:
            if resident is not None:  # what it will take when it loads again
                resident.estimate_bytes = loaded.weight_bytes
            return loaded.weight_bytes
        return resident.estimate_bytes if resident is not None else 0

    # ---- changing ---------------------------------------------------------------------------

    def engine_for(self, name: str, source: str | None = None) -> Engine:
        """The engine for `name`, made (not started) if it has none yet: an adapter's, a
        configured model's, or `source`'s (a registry entry a request may load)."""
        resident = self._residents.get(name)
        if resident is not None:
            return resident.engine
        if self._first.lockstep is not None:  # every rank would have to load it in step
            raise EngineError(
                "a distributed server serves one model: restart it to serve another",
                self._first.state,
            )
        adapter = self.adapters.get(name)
        if adapter is not None:
            base = self.engine_for(adapter.base)

            def loader(path, *args, base_name=adapter.base, **kwargs):
                from .adapters import load_adapter

                base_now = self.get(base_name)  # the base's engine when the adapter loads
                return load_adapter(base_now.loaded if base_now else None, path, name)

            engine = self._make_engine(adapter.path, name, loader=loader)
            estimate = sum(f.stat().st_size for f in Path(adapter.path).glob("*.safetensors"))
            # its base's arrays are its own too: the base is not unloaded for idleness meanwhile
            base.slot.needed = lambda base_name=adapter.base: self._stood_on(base_name)
        else:
            source = source or self.configured.get(name)
            if source is None:
                raise KeyError(name)
            engine = self._make_engine(source, name)
            estimate = estimate_weight_bytes(source)
        self._residents[name] = Resident(engine, time.monotonic(), estimate_bytes=estimate)
        engine.pin(name in self.pinned)
        return engine

    async def acquire(self, name: str, source: str | None = None) -> Engine:
        """The engine for `name`, its model loaded (or loading) with room made for it. Raises
        NoRoom when it does not fit and nothing can be unloaded."""
        resident = self._residents.get(name)
        if resident is not None and resident.engine.state == "error" and resident.engine.started:
            if resident.engine is self._first:
                return resident.engine  # its failure is the server's: requests say so
            del self._residents[name]  # its load failed: a new request tries afresh
        engine = self.engine_for(name, source)
        self._residents[name].last_used = time.monotonic()
        if engine is self._first and not engine.started:
            return engine  # its owner starts it (requests meanwhile get 503 loading)
        adapter = self.adapters.get(name)
        if adapter is None:
            await self._load(engine)
            return engine
        # The base is needed from now, not only once the adapter holds memory: a busy machine
        # can stall this loop past the base's idle unload between the two loads.
        self._adapters_arriving[adapter.base] += 1
        try:
            base = await self.acquire(adapter.base)  # first: the adapter loads onto its weights
            await base.ensure_loaded(timeout=UNLOAD_WAIT_S * 4)
            await self._load(engine, base)
        finally:
            self._adapters_arriving[adapter.base] -= 1
        return engine

    async def _load(self, engine: Engine, base: Engine | None = None) -> None:
        """Start `engine`'s load (or reload) once room is made for it, unless it holds memory."""
        if _holds_memory(engine):
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if _holds_memory(engine):
                return
            await self._make_room(engine)
            if base is not None:  # its idle time starts again once the adapter is gone
                base.slot.last_work = time.monotonic()
            if not engine.started:
                engine.start()
            elif engine.state == "unloaded":
                engine.reload()

    def _stood_on(self, base: str) -> bool:
        """Whether an adapter on `base` holds memory or is on its way to."""
        return self._adapters_arriving[base] > 0 or self._adapter_loaded_on(base)

    def _adapter_loaded_on(self, base: str) -> bool:
        return any(
            (engine := self.get(name)) is not None and _holds_memory(engine)
            for name, adapter in self.adapters.items()
            if adapter.base == base
        )

    def pin(self, name: str, pinned: bool = True) -> None:
        """Pin `name` (never unloaded to make room, nor for being idle) or unpin it."""
        if pinned:
            self.pinned.add(name)
        else:
            self.pinned.discard(name)
        engine = self.get(name)
        if engine is not None:
            engine.pin(pinned)

    def make_default(self, name: str) -> None:
        self.default_name = name

    def stop(self) -> None:
        for engine in reversed(self.engines):  # adapters before their bases
            engine.stop()

    async def _make_room(self, engine: Engine) -> None:
        need = self.footprint(engine)
        while self.memory_used(besides=engine) + need > self.budget_bytes:
            victim = self._least_recently_used(besides=engine)
            grace = time.monotonic() + NO_ROOM_GRACE_S
            while victim is None and time.monotonic() < grace:  # a request just ending
                await asyncio.sleep(UNLOAD_POLL_S)
                victim = self._least_recently_used(besides=engine)
            if victim is None:
                if not [e for e in self.resident() if e is not engine]:
                    log.warning(
                        "model %s needs %s, over the memory budget of %s: loading it alone",
                        engine.model_name,
                        size_text(need),
                        size_text(self.budget_bytes),
                    )
                    return
                busy = ", ".join(e.model_name for e in self.resident() if e is not engine)
                raise NoRoom(
                    f"model {engine.model_name} needs {size_text(need)} and does not fit the "
                    f"memory budget ({size_text(self.budget_bytes)}) beside {busy}, which are "
                    "busy or pinned; retry once their requests end"
                )
            log.info(
                "unloading %s (the least recently used model) to make room for %s",
                victim.model_name,
                engine.model_name,
            )
            victim.unload()
            deadline = time.monotonic() + UNLOAD_WAIT_S
            while _holds_memory(victim) and time.monotonic() < deadline:
                if victim.admitted_sequences:  # a request for it came first: it stays
                    victim.keep_loaded()
                    break
                await asyncio.sleep(UNLOAD_POLL_S)

    def _least_recently_used(self, besides: Engine) -> Engine | None:
        """The idle, unpinned resident model used longest ago, not a base an adapter in
        memory or on its way (`besides`, when an adapter, among them) stands on."""
        candidates = [
            r
            for name, r in self._residents.items()
            if r.engine is not besides
            and _holds_memory(r.engine)
            and r.engine.state == "ready"
            and name not in self.pinned
            and not self._stood_on(name)
            and r.engine.idle_for_eviction
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda r: r.last_used).engine


def _holds_memory(engine: Engine) -> bool:
    """Its model is loaded or on its way (not unloaded, failed, stopped or not started)."""
    if not engine.started:
        return False
    return engine.loaded is not None or engine.state in ("starting", "loading")
