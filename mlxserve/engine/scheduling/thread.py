"""The one thread that runs MLX: it steps every resident model's engine in turn.

MLX's work stays on one thread (its streams and caches are not shared across threads safely),
so several models take turns: a round gives each engine with work one step. A stream's gap is
then its own model's step plus the other models' steps of that round, which is why each engine's
prefill pacer is told how long the other models' streams already wait (`others_streaming_s`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("mlxserve.engine")
THREAD_NAME = "mlxserve-engine"


class EngineThread:
    """Runs the engines added to it, a step each per round, and sleeps while none has work.

    The thread starts with its first engine and ends once its last one has stopped."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._engines: list[Engine] = []
        self._thread: threading.Thread | None = None

    def add(self, engine: Engine) -> None:
        with self._lock:
            self._engines.append(engine)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
        self.wake.set()

    @property
    def engines(self) -> list[Engine]:
        with self._lock:
            return list(self._engines)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def step_others(self, loading: Engine) -> None:
        """While `loading` loads a model (between its slices): a step for every other engine
        with sequences running, so their streams go on through the load."""
        engines = [
            e
            for e in self.engines
            if e is not loading and e.begun and e.has_live_sequences and e.generator is not None
        ]
        for engine in engines:
            _pace_beside(engine, engines)
            engine.step_now()

    def _remove(self, engine: Engine) -> bool:
        """Forget a stopped engine; whether the thread has no engine left (and ends)."""
        with self._lock:
            if engine in self._engines:
                self._engines.remove(engine)
            if not self._engines:
                self._thread = None
                return True
            return False

    def _run(self) -> None:
        while True:
            self.wake.clear()  # before looking: a message posted from now on wakes the wait
            engines = self.engines
            if not engines:
                return
            for engine in engines:
                if not engine.begun and not engine.begin():
                    if self._remove(engine):
                        return
            engines = [e for e in self.engines if e.begun]
            for engine in engines:
                _pace_beside(engine, engines)
                if not engine.turn():
                    engine.finish()
                    if self._remove(engine):
                        return
            engines = self.engines
            if engines and all(e.begun and e.idle for e in engines):
                for engine in engines:
                    engine.before_sleep()
                waits = [w for e in engines if (w := e.idle_wait()) is not None]
                self.wake.wait(min(waits) if waits else None)


def _pace_beside(engine: Engine, engines: list[Engine]) -> None:
    """Tell `engine`'s pacer how long the other engines' streams wait for their own steps."""
    engine.others_streaming_s = sum(e.streaming_step_s() for e in engines if e is not engine)
