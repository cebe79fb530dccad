"""A real mlxserve server (Hypercorn on 127.0.0.1, a free port) running in a background thread.

In-process so tests can read the engine's counters; everything else is the real stack: the real
engine thread on a real MLX model, real sockets, real HTTP.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx

from mlxserve.engine import Engine
from mlxserve.server import run
from mlxserve.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, model: str, start_engine: bool = True, **settings):
        self.settings = Settings(model=model, host="127.0.0.1", port=free_port(), **settings)
        self.engine = Engine(
            model,
            prefix_cache_bytes=self.settings.prefix_cache_bytes,
            fim_template=self.settings.fim_template,
            idle_unload_s=self.settings.idle_unload_s,
        )
        self.start_engine = start_engine
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._listening = threading.Event()

    def _serve(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._shutdown = asyncio.Event()
            self._listening.set()
            await run(self.settings, self.engine, self._shutdown, self.start_engine)

        asyncio.run(main())

    def __enter__(self) -> LiveServer:
        self._thread.start()
        self._listening.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        if self.start_engine:
            assert self.engine.wait_ready(60), self.engine.error
        return self

    def __exit__(self, *exc) -> None:
        if self._loop and self._shutdown:
            self._loop.call_soon_threadsafe(self._shutdown.set)
        self._thread.join(15)
        self.engine.stop()
