"""The front's side of the engine process: starts it, talks to it, watches it, restarts it.

When the engine process dies (a signal, an abort, out of memory), every sequence in flight ends
at once with an error (503 `engine_restarted`), the engines show `restarting` (GET /health says
why), a new engine process starts and loads the models that were loaded, and requests arriving
meanwhile wait as for a first load. Deaths in a row, each soon after its start, back off.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from ..engine.models.naming import ServedNames
from ..engine.requests import GenerationEvent
from ..engine.states import EmbeddingFailed, EngineError, NoRoom
from ..platform.blas import cpu_environment
from ..settings import Settings
from .remote import RemotePool
from .schema import (
    DISTRIBUTED_EXIT,
    FROM_ENGINE,
    Call,
    Cancel,
    EngineView,
    Events,
    PoolView,
    Reply,
    Report,
    Started,
    encode,
)

log = logging.getLogger("mlxserve.ipc")
ENGINE_COMMAND = (sys.executable, "-m", "mlxserve.ipc.engine_main")
STOP_WAIT_S = 15.0  # a clean stop: the engine process's drain, then it is killed
STABLE_S = 30.0  # an engine process that died sooner after its start counts as a crash loop
MAX_BACKOFF_S = 30.0
CONNECT_WAIT_S = 5.0  # a started engine process's inbox is connected by then
CONNECT_POLL_S = 0.005
# After a death, the restart (a new process importing MLX: seconds of CPU) waits until the
# streams in flight have taken their error event, at most this long.
HANDED_OVER_WAIT_S = 1.0
HANDED_OVER_POLL_S = 0.005
RESTARTED = "engine_restarted"


def import_tokenizer_modules() -> None:
    importlib.import_module("mlx_lm.tokenizer_utils")


def signal_text(returncode: int | str) -> str:
    """How an engine process ended: its signal or exit code (or why it could not start)."""
    if isinstance(returncode, str):
        return returncode
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
        return f"signal {-returncode}"
    return f"exit code {returncode}"


class EngineSupervisor:
    """One engine process at a time; `pool` stands for its engines in the front."""

    def __init__(
        self,
        settings: Settings,
        command: tuple[str, ...] = ENGINE_COMMAND,
        on_fatal: Callable[[str], None] | None = None,
        stable_s: float = STABLE_S,
    ):
        """`command`: what starts the engine process (it reads the settings on its stdin).
        `on_fatal`: called when the default model's first load fails (the server then stops,
        as in one process). `stable_s`: how long an engine process must live for its death
        not to count towards a crash loop."""
        self.settings = settings
        self.command = command
        self.on_fatal = on_fatal
        self.stable_s = stable_s
        self.names = ServedNames.of(settings)
        self.generation = 0  # engine processes started so far
        self.restarts = 0
        self.pid: int | None = None
        self.pool = RemotePool(self, self.names, placeholder_view(settings, self.names))
        self._folder = Path(tempfile.mkdtemp(prefix="mlxserve-"))  # 0700: this user's alone
        self._context = zmq.asyncio.Context()
        self._plain = zmq.Context()
        self._to_engine = self._plain.socket(zmq.PUSH)
        self._to_engine.setsockopt(zmq.LINGER, 0)
        self._to_engine_address = f"ipc://{self._folder / 'to-engine'}"
        self._to_engine.bind(self._to_engine_address)
        # bound by `start`, on its loop (the engine process's messages wait in its socket
        # meanwhile: ZeroMQ connects whichever side comes first)
        self._from_engine: zmq.asyncio.Socket | None = None
        self._from_engine_address = f"ipc://{self._folder / 'from-engine'}"
        self._groups: dict[int, tuple[asyncio.Queue, set[int]]] = {}
        self._group_ids = itertools.count()
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._process: subprocess.Popen | None = None
        self._exited: concurrent.futures.Future | None = None  # exit code, or why no start
        self._loop: asyncio.AbstractEventLoop | None = None  # start's: every socket's thread
        self._started = asyncio.Event()
        self._stopping = False
        self._crashes_in_a_row = 0
        self._tasks: list[asyncio.Task] = []
        self._restore: list[tuple[str, str | None]] = []  # models to load again after a crash

    # ---- life ----------------------------------------------------------------------------

    async def start(self) -> RemotePool:
        """Start the engine process, unless `spawn` already did (its models load on; requests
        meanwhile wait as for a load)."""
        self._loop = asyncio.get_running_loop()
        self._from_engine = self._context.socket(zmq.PULL)
        self._from_engine.setsockopt(zmq.LINGER, 0)
        self._from_engine.bind(self._from_engine_address)
        self._tasks.append(supervised(self._receive()))
        if self._process is None:
            self.spawn()
        self._tasks.append(supervised(self._watch()))
        # What unpickling the model's tokenizer imports (transformers: most of a second), on
        # a thread while the engine process starts, rather than after its model is ready.
        self._tasks.append(asyncio.create_task(asyncio.to_thread(import_tokenizer_modules)))
        return self.pool

    def spawn(self) -> None:
        """Start an engine process now: `mlxserve serve` calls it before it imports the HTTP
        server, so that both processes' imports run at once."""
        self._started.clear()
        self.generation += 1
        command = [*self.command, "--to-engine", self._to_engine_address]
        command += ["--from-engine", self._from_engine_address, "--log-level"]
        command.append(logging.getLevelName(logging.getLogger().getEffectiveLevel()))
        command += ["--front-pid", str(os.getpid())]
        # under what `mlxserve serve` would re-execute itself with, for MLX's CPU backend
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, env=cpu_environment(os.environ)
            )
        except OSError as error:  # out of memory or of processes: a death, started again later
            self._could_not_start(error)
            return
        try:
            process.stdin.write(msgspec.json.encode(self.settings, enc_hook=str))
        except BrokenPipeError:  # it died before it read them: a death like any other, below
            pass
        finally:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        self._process, self.pid = process, process.pid
        self._spawned_at = time.monotonic()
        self._exited = exited = concurrent.futures.Future()
        threading.Thread(
            target=lambda: exited.set_result(process.wait()), name="engine-watch", daemon=True
        ).start()
        log.info("engine process %d started", self.pid)

    def _could_not_start(self, error: OSError) -> None:
        log.error("the engine process could not start: %s", error)
        self._process, self.pid = None, None
        self._spawned_at = time.monotonic()
        self._exited = concurrent.futures.Future()
        self._exited.set_result(f"could not start: {error.strerror or error}")

    async def _watch(self) -> None:
        while True:
            returncode = await asyncio.wrap_future(self._exited)
            if self._stopping:
                return
            because = signal_text(returncode)
            if self.settings.distributed:
                self._distributed_engine_died(because)
                return
            ended = self._engine_died(because)
            lived = time.monotonic() - self._spawned_at
            self._crashes_in_a_row = self._crashes_in_a_row + 1 if lived < self.stable_s else 1
            delay = 0.0
            if self._crashes_in_a_row > 1:
                delay = min(MAX_BACKOFF_S, 2.0 ** (self._crashes_in_a_row - 2))
                log.error(
                    "the engine process died %d times in a row, each within %.0f s of its "
                    "start (last: %s); starting it again in %.0f s",
                    self._crashes_in_a_row,
                    self.stable_s,
                    because,
                    delay,
                )
                self.pool.engine_gone(
                    f"restarting: the engine process died {self._crashes_in_a_row} times in "
                    f"a row (last: {because}); next start in {delay:.0f} s"
                )
            await handed_over(ended, HANDED_OVER_WAIT_S)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.restarts += 1
            self.spawn()

    def _engine_died(self, because: str) -> list[asyncio.Queue]:
        """Every sequence in flight ends now with a 503; calls waiting get an error. Returns
        the ended sequences' queues."""
        log.error("the engine process %s died (%s): restarting it", self.pid, because)
        ended = self._fail_in_flight(
            f"the engine process died ({because}); it is restarting", RESTARTED
        )
        pool = self.pool
        self._restore = [
            (e.model_name, e.model_source)
            for e in pool.engines
            if e.view.loaded or e.view.state in ("loading", "starting") and e.view.started
        ]
        self._restore_default = pool.default_name
        pool.engine_gone(f"restarting: the engine process died ({because})")
        return ended

    def _distributed_engine_died(self, because: str) -> None:
        """Rank 0's engine is one of the ranks' lock-step: another cannot take its place, so
        the server stops (as when a rank is lost), after ending what is still in flight."""
        default = self.pool.default.view
        message = default.error if default.state == "error" and default.error else None
        message = message or f"the distributed server's engine process died ({because})"
        log.error("%s: the server stops", message)
        self._fail_in_flight(message, None)
        self.pool.engine_failed(message)
        self._fatal(message)

    def _fatal(self, message: str) -> None:
        """The server cannot serve: `on_fatal`, once."""
        if self.on_fatal:
            on_fatal, self.on_fatal = self.on_fatal, None
            on_fatal(message)

    def _fail_in_flight(self, message: str, code: str | None) -> list[asyncio.Queue]:
        self._started.clear()
        ended = [group[0] for group in self._groups.values()]
        for group in self._groups.values():
            end_group(group, message, code)
        self._groups.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineError(message, "restarting" if code else "error"))
        self._calls.clear()
        return ended

    async def _restore_models(self) -> None:
        """The models loaded before a crash, loaded again (the default loads by itself)."""
        for name, source in self._restore:
            if name == self.pool.default_name:
                continue
            with contextlib.suppress(EngineError, NoRoom, KeyError):
                await self.call("acquire", name, source=source)
        default = getattr(self, "_restore_default", None)
        if default and default != self.pool.default_name and self.pool.get(default):
            self.call_soon("make_default", default)
        for name in self.pool.pinned ^ set(self.names.pinned):
            self.call_soon("pin", name, pinned=name in self.pool.pinned)

    def stop_engine(self) -> None:
        """Ask the engine process to stop (its engines fail what is still in flight). From any
        thread (a drain stops the pool from a worker thread): the socket is the loop's alone."""
        if not self._stopping:
            self._stopping = True
            data = encode(Call(next(self._call_ids), "stop"))
            self._loop.call_soon_threadsafe(self._send, data)

    async def close(self) -> None:
        """Stop the engine process (killed if it does not end in STOP_WAIT_S), and the sockets."""
        self.stop_engine()
        await asyncio.sleep(0)  # the stop sent (a callback on this loop) before sockets close
        process = self._process
        if process is not None and process.poll() is None:
            try:
                await asyncio.wait_for(
                    asyncio.shield(asyncio.wrap_future(self._exited)), STOP_WAIT_S
                )
            except asyncio.TimeoutError:
                log.warning("the engine process did not stop in %.0f s: killed", STOP_WAIT_S)
                process.kill()
                await asyncio.wrap_future(self._exited)
        if process is not None and process.returncode == DISTRIBUTED_EXIT and self.on_fatal:
            # it lost a rank while the front was stopping anyway (mlx.launch stops every rank
            # when one dies): the server still failed
            self._distributed_engine_died(signal_text(process.returncode))
        for task in self._tasks:
            task.cancel()
        self._to_engine.close()
        self._from_engine.close()
        self._context.term()
        self._plain.term()
        shutil.rmtree(self._folder, ignore_errors=True)

    def kill(self) -> None:
        """At the front's exit without a clean stop: the engine process goes with it."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    # ---- talking -------------------------------------------------------------------------

    def _send(self, data: bytes) -> bool:
        try:
            self._to_engine.send(data, zmq.NOBLOCK)
            return True
        except zmq.Again:  # no engine process connected (it died, or is starting)
            return False

    def open_group(self, size: int) -> tuple[int, asyncio.Queue]:
        group_id = next(self._group_ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._groups[group_id] = (queue, set(range(size)))
        return group_id, queue

    def send(self, message, group_id: int) -> None:
        """A group's Submit; when no engine process takes it, its sequences end at once."""
        if not self._send(encode(message)):
            group = self._groups.pop(group_id, None)
            if group is not None:
                end_group(group, "the engine process is restarting", RESTARTED)

    def close_group(self, group_id: int, cancel: bool) -> None:
        if self._groups.pop(group_id, None) is not None and cancel:
            self._send(encode(Cancel(group_id)))

    async def wait_started(self, timeout: float) -> None:
        """Until an engine process is up (at once but while one starts or restarts)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._started.wait(), timeout)

    async def call(self, op: str, model: str = "", **args) -> Reply:
        """One pool or engine operation in the engine process; its errors raised here."""
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        data = encode(Call(call_id, op, model, args))
        deadline = time.monotonic() + CONNECT_WAIT_S
        while not self._send(data):
            # a new engine process's socket connects a moment after it said it started
            if not self._started.is_set() or time.monotonic() > deadline:
                self._calls.pop(call_id, None)
                raise EngineError("the engine process is restarting", "restarting")
            await asyncio.sleep(CONNECT_POLL_S)
        reply: Reply = await future
        if reply.error is None:
            return reply
        if reply.kind == "no_room":
            raise NoRoom(reply.error)
        if reply.kind == "unknown_model":
            raise KeyError(model)
        if reply.kind == "embedding":
            raise EmbeddingFailed(reply.error)
        raise EngineError(reply.error, reply.state or "error")

    def call_soon(self, op: str, model: str = "", **args) -> None:
        """A call whose outcome nobody waits for (its failure is logged)."""

        async def run() -> None:
            try:
                await self.call(op, model, **args)
            except (EngineError, NoRoom, KeyError) as error:
                log.warning("%s %s: %s", op, model, error)

        asyncio.get_running_loop().create_task(run())

    async def _receive(self) -> None:
        socket = self._from_engine
        while True:
            message = FROM_ENGINE.decode(await socket.recv(copy=False))
            if isinstance(message, Events):
                groups = self._groups
                for group_id, event in message.items:
                    entry = groups.get(group_id)
                    if entry is not None:
                        if event.finished:
                            entry[1].discard(event.index)
                        entry[0].put_nowait(event)
            elif isinstance(message, Report):
                self.pool.apply(message.pool)
                self._check_first_load()
            elif isinstance(message, Reply):
                self.pool.apply(message.pool)
                future = self._calls.pop(message.call_id, None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif isinstance(message, Started):
                self.pid = message.pid
                self.pool.apply(message.pool)
                if self.generation > 1:
                    asyncio.get_running_loop().create_task(self._restore_models())
                self._started.set()

    def _check_first_load(self) -> None:
        """The default model's first load failed: the server cannot serve (as in one
        process: it exits 1)."""
        default = self.pool.default
        view = default.view
        if view.state == "error" and not view.loads and self.generation == 1:
            self._fatal(view.error or "the model failed to load")


def supervised(work) -> asyncio.Task:
    """A task of the supervision's own: should it ever end by an exception, the log says so at
    once (an asyncio task's exception is otherwise logged only when the task is collected)."""
    task = asyncio.create_task(work)
    task.add_done_callback(log_failure)
    return task


def log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        log.error("the engine supervisor's %s ended", task.get_coro().__qualname__, exc_info=error)


async def handed_over(queues: list[asyncio.Queue], timeout: float) -> None:
    """Until every queue's events are taken by its response (or `timeout`): ended streams'
    error events reach their clients before a restart competes with them for the CPU."""
    deadline = time.monotonic() + timeout
    while any(not q.empty() for q in queues) and time.monotonic() < deadline:
        await asyncio.sleep(HANDED_OVER_POLL_S)


def end_group(group: tuple[asyncio.Queue, set[int]], message: str, code: str | None) -> None:
    """Every sequence of the group still open ends now with `message` (a 503)."""
    queue, open_indexes = group
    for index in sorted(open_indexes):
        queue.put_nowait(GenerationEvent(index=index, error=message, unavailable=True, code=code))
    open_indexes.clear()


def placeholder_view(settings: Settings, names: ServedNames) -> PoolView:
    """The pool before the engine process's first report: the default model starting."""
    idle = settings.idle_unload_s
    starting = EngineView(
        names.default_name,
        settings.model,
        "starting",
        idle_unload_s=idle,
        default_idle_unload_s=idle,
    )
    return PoolView(
        names.default_name, settings.memory_budget_bytes, 0, list(names.pinned), [starting]
    )
