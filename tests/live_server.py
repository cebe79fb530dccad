"""A real mlxserve server (Hypercorn on 127.0.0.1, a free port) running in a background thread.

In-process so tests can read the engine's counters; everything else is the real stack: the real
engine thread on a real MLX model, real sockets, real HTTP.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import itertools
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

from mlxserve.engine import Engine
from mlxserve.engine.models.served import new_engine
from mlxserve.server import run
from mlxserve.settings import Settings

# Ports below Linux's ephemeral range (32768-60999), so no client socket takes one between the
# check and the server's bind, in blocks: each test process (pytest-xdist workers, the portable
# pass, a colleague's run) holds a lock on a block of its own for as long as it runs.
PORTS_FROM = 20_000
PORT_BLOCKS = 12
PORTS_PER_BLOCK = 1_000
# mlx.launch's ring takes `--starting-port` and the ports after it, one per rank.
PORT_STRIDE = 10
_port_slots = itertools.count()


@functools.cache
def _port_block() -> tuple[int, IO]:
    """The first port of a block no other process holds, and the open lock file holding it."""
    for block in range(PORT_BLOCKS):
        # Left open: the lock lasts as long as this process.
        lock = open(Path(tempfile.gettempdir()) / f"mlxserve-test-ports-{block}.lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return PORTS_FROM + block * PORTS_PER_BLOCK, lock
    raise RuntimeError(f"all {PORT_BLOCKS} blocks of test ports are held by other processes")


def free_port() -> int:
    """A port free now that no other test process will pick."""
    base, _ = _port_block()
    for _ in range(PORTS_PER_BLOCK // PORT_STRIDE):
        port = base + next(_port_slots) * PORT_STRIDE % PORTS_PER_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {base}-{base + PORTS_PER_BLOCK - 1}")


class ServerThread:
    """A server's event loop on a thread of this process, on 127.0.0.1 and a free port:
    `_main` serves until `_shutdown` is set (`__exit__`)."""

    def __init__(self, model, **settings):
        self.settings = Settings(model=str(model), host="127.0.0.1", port=free_port(), **settings)
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._listening = threading.Event()

    async def _main(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._shutdown = asyncio.Event()
            await self._main()

        asyncio.run(main())

    def _start(self) -> None:
        self._thread.start()
        self._listening.wait(60)

    def wait_healthy(self, timeout: float = 600, ready: bool = True) -> None:
        """Until /health answers (`ready`: 200)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status = httpx.get(self.url + "/health", timeout=1).status_code
                if status == 200 or not ready:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        if ready:
            raise AssertionError(f"{self.url} not healthy in {timeout} s")

    def __exit__(self, *exc) -> None:
        if self._loop and self._shutdown:
            self._loop.call_soon_threadsafe(self._shutdown.set)
        self._thread.join(self.join_timeout_s)

    join_timeout_s = 15.0


class LiveServer(ServerThread):
    """`engine`: serve one already started (and stopped by its owner), instead of a new one."""

    def __init__(
        self, model: str, start_engine: bool = True, engine: Engine | None = None, **settings
    ):
        super().__init__(model, **settings)
        self.own_engine = engine is None
        self.engine = engine or new_engine(self.settings, model)
        self.start_engine = start_engine and self.own_engine

    async def _main(self) -> None:
        self._listening.set()
        await run(self.settings, self.engine, self._shutdown, self.start_engine)

    def __enter__(self) -> LiveServer:
        self._start()
        self.wait_healthy(30, ready=False)
        if self.start_engine:
            # A generous bound: the portable pass loads SmolLM2 in about a minute here when
            # both cores are busy (its load-time prefill timing runs MLX's quantized kernels).
            assert self.engine.wait_ready(300), self.engine.error
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self.own_engine:
            self.engine.stop()


class LiveServers:
    """Every LiveServer of a test session. `shared`: one per model and settings, started on first
    use and kept to the end, for tests that leave the server as they found it; `own`: a fresh one
    for a test that changes server state (switches or unloads models, drains, stops)."""

    def __init__(self) -> None:
        self._shared: dict[tuple, LiveServer] = {}

    def shared(self, model, **settings) -> LiveServer:
        key = (str(model), frozenset(settings.items()))
        if key not in self._shared:
            self._shared[key] = LiveServer(str(model), **settings).__enter__()
        return self._shared[key]

    @contextmanager
    def own(self, model, **settings) -> Iterator[LiveServer]:
        with LiveServer(str(model), **settings) as live:
            yield live

    def stop_all(self) -> None:
        for live in self._shared.values():
            live.__exit__(None, None, None)
        self._shared.clear()


class FrontServer(ServerThread):
    """The front (Hypercorn on a thread of this process) with its engine in a process of its own,
    as `mlxserve serve` runs them: the real supervisor, sockets and engine process.
    `engine_command`: what starts the engine process (tests/engine_faults.py's for an abort);
    `stable_s`: the supervisor's crash-loop window."""

    join_timeout_s = 30.0

    def __init__(self, model, engine_command=None, stable_s: float | None = None, **settings):
        super().__init__(model, **settings)
        self.options = {}
        if engine_command is not None:
            self.options["command"] = tuple(engine_command)
        if stable_s is not None:
            self.options["stable_s"] = stable_s
        self.supervisor = None

    async def _main(self) -> None:
        from mlxserve.ipc.supervisor import EngineSupervisor
        from mlxserve.server import run_front

        self.supervisor = EngineSupervisor(self.settings, **self.options)
        self._listening.set()
        await run_front(self.settings, self._shutdown, supervisor=self.supervisor)

    @property
    def pool(self):
        return self.supervisor.pool

    def __enter__(self) -> FrontServer:
        self._start()
        self.wait_healthy()
        return self
