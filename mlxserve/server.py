"""Running the app on Hypercorn, with the engine started inside the server's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal

from hypercorn.asyncio import serve
from hypercorn.config import Config

from .api.app import create_app
from .engine import Engine
from .settings import Settings

log = logging.getLogger("mlxserve")


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 30
    # Graceful stop: in-flight responses get this long to finish.
    config.graceful_timeout = 5
    return config


def warn_if_exposed(settings: Settings) -> None:
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if not loopback and not settings.api_key:
        log.warning(
            "listening on %s without an API key: anyone on the network can use this server "
            "(set --api-key or MLXSERVE_API_KEY)",
            settings.host,
        )


async def run(
    settings: Settings, engine: Engine, shutdown: asyncio.Event, start_engine: bool = True
) -> None:
    """Serve until `shutdown` is set; the engine loads its model meanwhile (503 until ready)."""
    app = create_app(settings, engine)
    if start_engine:
        engine.start()
    await serve(app, hypercorn_config(settings), shutdown_trigger=shutdown.wait)


def serve_forever(settings: Settings) -> int:
    """Run the server; returns the process exit code (1 when the model failed to load).

    With `settings.distributed` (under mlx.launch), rank 0 serves HTTP and every other rank
    follows its engine in lock-step (engine/distributed.py)."""
    cluster = None
    if settings.distributed:
        from .engine.distributed import Cluster

        cluster = Cluster()
        log.info("distributed: rank %d of %d (pid %d)", cluster.rank, cluster.size, os.getpid())
        if not cluster.leader:
            return Engine(
                settings.model, fim_template=settings.fim_template, cluster=cluster
            ).follow()
    warn_if_exposed(settings)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        shutdown = asyncio.Event()
        failed: list[str] = []

        def on_fatal(message: str) -> None:
            failed.append(message)
            loop.call_soon_threadsafe(shutdown.set)

        # Stop cleanly on Ctrl-C and SIGTERM, even when started with SIGINT ignored (a background
        # job of a non-interactive shell): Hypercorn installs no handlers given a shutdown trigger.
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, shutdown.set)
        engine = Engine(
            settings.model,
            on_fatal=on_fatal,
            prefix_cache_bytes=settings.prefix_cache_bytes,
            fim_template=settings.fim_template,
            idle_unload_s=settings.idle_unload_s,
            cluster=cluster,
            rank_timeout_s=settings.rank_timeout_s,
        )
        log.info(
            "serving on http://%s:%d (model %s loading)",
            settings.host,
            settings.port,
            settings.model,
        )
        try:
            await run(settings, engine, shutdown)
        finally:
            engine.stop()
        if failed and cluster is not None:
            # The engine thread may be stuck in a collective with a lost rank: do not wait
            # for it (or for MLX's teardown) at interpreter exit.
            logging.shutdown()
            os._exit(1)
        return 1 if failed else 0

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 0
