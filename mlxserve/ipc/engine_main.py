"""The engine process: every MLX call of the server, driven by the front process over ZeroMQ.

It builds the engines and their pool from the front's settings, as one process would, and
serves the schema (ipc/schema.py): groups of sequences in, one message of events per engine
step out, calls for the pool's operations, and a report of the engines' state whenever it
changes. It stops when the front says so, and exits when the front is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from ..engine.requests import GenerationEvent
from ..engine.states import EmbeddingFailed, EngineError, NoRoom
from ..settings import Settings
from .schema import (
    DISTRIBUTED_EXIT,
    TO_ENGINE,
    Call,
    Cancel,
    EngineView,
    Events,
    FactsWire,
    PoolView,
    Reply,
    Report,
    Started,
    Submit,
    encode,
)

log = logging.getLogger("mlxserve.engine")
EMPTY_POOL = PoolView("", 0, 0, [], [])  # a reply's pool until the call has run
REPORT_EVERY_S = 0.05  # the front's view of the engines lags their state by this at most
# At rest (nothing in flight, loading or generating), by this at most: an idle process wakes
# seldom (on a laptop each wake-up costs energy), and a change no request caused (an idle
# unload) reaches the front this late.
AT_REST_REPORT_EVERY_S = 1.0
AT_REST_STATES = frozenset({"ready", "unloaded", "error", "stopped"})
PARENT_CHECK_EVERY_S = 0.5  # how soon the engine process notices its front is gone
AT_REST_PARENT_CHECK_S = 2.0  # the same, at rest (nothing of the front's is lost then)
FLUSH_BEFORE_EXIT_S = 2.0  # at most, for the last messages to reach the front


class EngineProcess:
    def __init__(
        self, settings: Settings, to_engine: str, from_engine: str, front_pid: int | None = None
    ):
        """`front_pid`: the process that started this one, which it outlives by at most
        PARENT_CHECK_EVERY_S, AT_REST_PARENT_CHECK_S at rest (None: whichever is its parent
        now)."""
        from ..engine.models.served import new_engine, pool_for

        self.settings = settings
        self.parent = front_pid or os.getppid()
        self.context = zmq.asyncio.Context()
        self.inbox = self.context.socket(zmq.PULL)
        self.inbox.connect(to_engine)
        # Sent to from the engine thread (events) and the loop (reports, replies): one socket
        # of the plain kind, behind a lock.
        self._plain = zmq.Context()
        self.outbox = self._plain.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 1000)
        self.outbox.connect(from_engine)
        self._send_lock = threading.Lock()
        self._remaining: dict[int, int] = {}  # group id: sequences not finished
        self._groups: dict[int, Any] = {}  # group id: its engine
        options = {}
        if settings.distributed:  # rank 0 of the ranks mlx.launch started (cli.py decided)
            from ..engine.cluster.lockstep import Cluster, cluster_options

            options = {
                "cluster": Cluster(**cluster_options(settings)),
                "on_fatal": self.exit_lost,
            }
        self.engine = new_engine(settings, settings.model, **options)
        self.pool = pool_for(settings, self.engine)
        self._last_report = b""
        self._last_view: PoolView | None = None
        self._calls: set[asyncio.Task] = set()
        self._woken = asyncio.Event()  # a message came: the view may change soon
        self._stopping = asyncio.Event()

    # ---- sending ---------------------------------------------------------------------------

    def send(self, message) -> None:
        data = encode(message)
        with self._send_lock:
            self.outbox.send(data, copy=False)

    def sink(self, items: list[tuple[int, GenerationEvent]]) -> None:
        """A step's events, in one message (the engine thread's `posted_together`)."""
        for group_id, event in items:
            if event.finished:
                left = self._remaining.get(group_id, 1) - 1
                if left <= 0:
                    self._remaining.pop(group_id, None)
                    self._groups.pop(group_id, None)
                else:
                    self._remaining[group_id] = left
        self.send(Events(items))

    def exit_lost(self, message: str) -> None:
        """Distributed: a rank is gone, or the model cannot load over the ranks. The engine has
        ended every sequence with its error; the front gets them and the engines' last state,
        then this process exits (its engine thread may be stuck in a collective), and the
        front stops (the ranks cannot go on without one)."""
        with self._send_lock:
            self.outbox.send(encode(Report(self.view())))
            self.outbox.close(linger=int(FLUSH_BEFORE_EXIT_S * 1000))  # sent, or given up
            self._plain.term()
        logging.shutdown()
        os._exit(DISTRIBUTED_EXIT)

    def view(self) -> PoolView:
        pool = self.pool
        return PoolView(
            default_name=pool.default_name,
            budget_bytes=pool.budget_bytes,
            memory_bytes=self.engine.memory_bytes(),
            pinned=sorted(pool.pinned),
            engines=[self._engine_view(e) for e in pool.engines],
        )

    def _engine_view(self, engine) -> EngineView:
        slot = engine.slot
        progress = engine.load_progress
        return EngineView(
            name=engine.model_name,
            source=engine.model_source,
            state=engine.state,
            started=engine.started,
            begun=engine.begun,
            loads=engine.loads,
            error=engine.error,
            load_error=engine.load_error,
            load_progress=progress.as_dict() if progress is not None else None,
            idle_unload_s=engine.idle_unload_s,
            default_idle_unload_s=engine.default_idle_unload_s,
            keep_alive_until=engine.keep_alive_until(),
            idle_for_eviction=engine.idle_for_eviction,
            pending_change=slot.pending is not None,
            unloading=slot.unloading,
            stats=engine.stats,
            tokens_per_second=engine.current_tokens_per_second(),
            footprint=self.pool.footprint(engine) if engine.loaded is not None else 0,
            loaded=engine.loaded is not None,
        )

    def report(self, force: bool = False) -> None:
        view = self._last_view = self.view()
        data = encode(view)
        if force or data != self._last_report:
            self._last_report = data
            self.send(Report(view))

    # ---- receiving -------------------------------------------------------------------------

    def submit(self, message: Submit) -> None:
        engine = self.pool.get(message.model)
        group = _group(message, self.sink)
        if engine is None:
            group.fail(f"model {message.model} is not loaded", unavailable=True)
            return
        try:
            engine.check_ready()
        except EngineError as error:
            group.fail(str(error), unavailable=True)
            return
        self._remaining[message.group_id] = len(message.requests)
        self._groups[message.group_id] = engine
        engine.add_group(group)

    def cancel(self, message: Cancel) -> None:
        self._remaining.pop(message.group_id, None)
        engine = self._groups.pop(message.group_id, None)
        if engine is not None:
            engine.cancel_group(message.group_id)

    async def call(self, message: Call) -> None:
        operation = OPERATIONS.get(message.op)
        reply = Reply(message.call_id, EMPTY_POOL)
        try:
            if operation is None:
                raise ValueError(f"no operation {message.op!r}")
            reply.value = await operation(self, message.model, **message.args)
        except NoRoom as error:
            reply.error, reply.kind = str(error), "no_room"
        except EmbeddingFailed as error:
            reply.error, reply.kind = str(error), "embedding"
        except EngineError as error:
            reply.error, reply.kind, reply.state = str(error), "engine", error.state
        except KeyError as error:
            reply.error, reply.kind = str(error), "unknown_model"
        except Exception as error:
            log.exception("the front's call %s failed", message.op)
            reply.error, reply.kind = f"{type(error).__name__}: {error}", "failed"
        reply.pool = self.view()
        self.send(reply)

    async def serve(self) -> None:
        from ..engine.models.served import start_served_models

        self.engine.start()
        self.send(Started(os.getpid(), self.view()))
        starting = asyncio.create_task(start_served_models(self.pool, self.settings))
        reporting = asyncio.create_task(self._report_now_and_then())
        try:
            while not self._stopping.is_set():
                every_s = AT_REST_PARENT_CHECK_S if self._at_rest() else PARENT_CHECK_EVERY_S
                if not await self.inbox.poll(every_s * 1000):
                    if os.getppid() != self.parent:
                        log.error("the front process is gone: the engine process exits")
                        return
                    continue
                message = TO_ENGINE.decode(await self.inbox.recv(copy=False))
                self._woken.set()
                if isinstance(message, Submit):
                    self.submit(message)
                elif isinstance(message, Cancel):
                    self.cancel(message)
                else:
                    task = asyncio.create_task(self.call(message))
                    self._calls.add(task)
                    task.add_done_callback(self._calls.discard)
        finally:
            starting.cancel()
            reporting.cancel()

    async def _report_now_and_then(self) -> None:
        while True:
            if self._at_rest():
                self._woken.clear()
                with contextlib.suppress(asyncio.TimeoutError):  # (not TimeoutError before 3.11)
                    await asyncio.wait_for(self._woken.wait(), AT_REST_REPORT_EVERY_S)
            else:
                await asyncio.sleep(REPORT_EVERY_S)
            self.report()

    def _at_rest(self) -> bool:
        """Nothing in flight, and the last view sent shows every engine settled and idle."""
        view = self._last_view
        if view is None or self._groups or self._calls:
            return False
        return all(
            e.state in AT_REST_STATES
            and not e.pending_change
            and not e.unloading
            and not e.tokens_per_second
            for e in view.engines
        )

    async def stop(self) -> None:
        await asyncio.to_thread(self.pool.stop)
        self.engine.stop()
        self.report(force=True)
        self._stopping.set()


def _group(message: Submit, sink):
    from ..engine.scheduling.messages import Group

    return Group(message.group_id, message.requests, sink=sink)


# ---- the calls ------------------------------------------------------------------------------


async def _acquire(process: EngineProcess, model: str, source: str | None = None) -> None:
    await process.pool.acquire(model, source)


async def _ensure_loaded(process: EngineProcess, model: str) -> None:
    """An unloaded model is loaded again (the front then waits for its state to say ready)."""
    engine = process.pool.get(model)
    if engine is None:
        raise KeyError(model)
    await engine.ensure_loaded(timeout=0)


async def _on_engine(process: EngineProcess, model: str, method: str, *args) -> None:
    engine = process.pool.get(model)
    if engine is None:
        raise KeyError(model)
    getattr(engine, method)(*args)


async def _unload(process, model):
    await _on_engine(process, model, "unload")


async def _keep_alive(process, model, seconds: float | None = None):
    await _on_engine(process, model, "keep_alive", seconds)


async def _stopping_soon(process, model):
    await _on_engine(process, model, "stopping_soon")


async def _pin(process, model, pinned: bool = True):
    process.pool.pin(model, pinned)


async def _make_default(process, model):
    process.pool.make_default(model)


async def _facts(process: EngineProcess, model: str) -> FactsWire | None:
    engine = process.pool.get(model)
    loaded = engine.loaded if engine is not None else None
    if loaded is None:
        return None
    return FactsWire.of(loaded, await asyncio.to_thread(pickle.dumps, loaded.tokenizer))


async def _slots(process: EngineProcess, model: str):
    engine = process.pool.get(model)
    return await engine.running_slots() if engine is not None else []


async def _embed(
    process: EngineProcess,
    model: str,
    rows: list[list[int]],
    seconds: list[int] | None = None,
    per_token: bool = False,
) -> dict[str, Any]:
    """The rows' vectors as float32 bytes and their shape (msgpack carries bytes as they are);
    per token, every row's states one after the other."""
    engine = process.pool.get(model)
    if engine is None:
        raise KeyError(model)
    vectors = await engine.embed(rows, seconds, per_token)
    if per_token:
        vectors = np.concatenate(vectors)
    return {"shape": list(vectors.shape), "data": vectors.astype("<f4").tobytes()}


async def _stop(process: EngineProcess, model: str) -> None:
    await process.stop()


OPERATIONS: dict[str, Callable[..., Awaitable[Any]]] = {
    "acquire": _acquire,
    "ensure_loaded": _ensure_loaded,
    "unload": _unload,
    "keep_alive": _keep_alive,
    "stopping_soon": _stopping_soon,
    "pin": _pin,
    "make_default": _make_default,
    "facts": _facts,
    "slots": _slots,
    "embed": _embed,
    "stop": _stop,
}


def _path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(kind)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlxserve.ipc.engine_main")
    parser.add_argument("--to-engine", required=True)
    parser.add_argument("--from-engine", required=True)
    parser.add_argument("--log-level", default="INFO")
    # the front's own pid: a front gone before this process asks for its parent (a second of
    # imports, on a slow machine more) would otherwise leave it running with init as its parent
    parser.add_argument("--front-pid", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The front drains on Ctrl-C and then says stop; a terminal's SIGINT reaches this
    # process's group too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    settings = msgspec.json.decode(sys.stdin.buffer.read(), type=Settings, dec_hook=_path)
    if args.front_pid is not None and os.getppid() != args.front_pid:
        log.error("the front process is gone: the engine process exits")
        return 0

    from ..platform.blas import warn_if_slow

    warn_if_slow()

    async def run() -> None:
        process = EngineProcess(settings, args.to_engine, args.from_engine, args.front_pid)
        await process.serve()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    from ..cli import exit_without_finalizing

    exit_without_finalizing(main())
