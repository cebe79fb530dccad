"""Running the app on Hypercorn, with the engine started inside the server's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from hypercorn.asyncio import serve
from hypercorn.config import Config

from .api.admission import DRAINING
from .api.app import create_app
from .engine.cluster.launched import engine_in_front
from .platform.blas import warn_if_slow
from .settings import Settings

if TYPE_CHECKING:
    from .engine import Engine
    from .engine.models.pool import ModelPool
    from .ipc.supervisor import EngineSupervisor

log = logging.getLogger("mlxserve")


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    # An idle connection, or one still sending its request headers (slowloris), is closed
    # after the body timeout: Hypercorn's keep-alive timer runs until a request is complete.
    config.keep_alive_timeout = settings.limits.body_timeout_s
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
    settings: Settings,
    engine: Engine,
    shutdown: asyncio.Event,
    start_engine: bool = True,
    stopping: asyncio.Event | None = None,
) -> None:
    """Serve until `shutdown` is set; the models load meanwhile (503 until ready).

    Setting `stopping` drains first: new generation requests get 503, those in flight get
    `settings.drain_timeout_s` to finish, then `shutdown` is set."""
    from .engine.models.served import pool_for, start_served_models

    pool = pool_for(settings, engine)
    starting = None
    if start_engine:
        engine.start()  # the others load after it, while the server already answers
        starting = asyncio.create_task(start_served_models(pool, settings))
    try:
        await serve_app(settings, pool, shutdown, stopping)
    finally:
        if starting is not None:
            starting.cancel()
        if start_engine:  # the default engine's owner stops it; the others are the pool's
            for other in pool.engines[1:]:
                await asyncio.to_thread(other.stop)


async def serve_app(
    settings: Settings, pool, shutdown: asyncio.Event, stopping: asyncio.Event | None
) -> None:
    """The app over `pool` (a ModelPool, or ipc's RemotePool) on Hypercorn until `shutdown`;
    setting `stopping` drains first."""
    app = create_app(settings, pool)
    drain = None
    if stopping is not None:
        drain = asyncio.create_task(drain_then_stop(app, pool, stopping, shutdown, settings))
    try:
        await serve(app, hypercorn_config(settings), shutdown_trigger=shutdown.wait)
    finally:
        if drain is not None:
            drain.cancel()


def pending_sequences(pool: ModelPool) -> int:
    return sum(e.pending_sequences for e in pool.engines)


async def drain_then_stop(
    app, pool: ModelPool, stopping: asyncio.Event, shutdown: asyncio.Event, settings: Settings
) -> None:
    await stopping.wait()
    app.config[DRAINING] = True
    deadline = time.monotonic() + settings.drain_timeout_s
    if pending_sequences(pool):
        log.info(
            "stopping: %d sequences in flight get up to %g s to finish",
            pending_sequences(pool),
            settings.drain_timeout_s,
        )
    while pending_sequences(pool) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if pending_sequences(pool):
        log.warning("stopping with %d sequences unfinished", pending_sequences(pool))
        await asyncio.to_thread(pool.stop)  # they end with a 503 error, not a cut stream
    shutdown.set()


SWITCH_INTERVAL_ENV = "MLXSERVE_SWITCH_INTERVAL_MS"


def set_switch_interval() -> None:
    """`$MLXSERVE_SWITCH_INTERVAL_MS`: how long a thread may hold Python's interpreter lock
    while another waits for it (Python's default: 5 ms). The engine thread, back from a device
    pass, waits that long at most while the server's loop writes streams; benchmarks compare
    settings (`benchmarks/concurrency.py --switch-interval-ms`)."""
    milliseconds = os.environ.get(SWITCH_INTERVAL_ENV)
    if milliseconds:
        sys.setswitchinterval(float(milliseconds) / 1000)


async def run_front(
    settings: Settings,
    shutdown: asyncio.Event,
    stopping: asyncio.Event | None = None,
    supervisor: EngineSupervisor | None = None,
) -> None:
    """Serve until `shutdown` is set, the engine in a process of its own (ipc/): started
    now, watched, restarted when it dies; stopped (drained as `run` drains) at the end."""
    from .ipc.supervisor import EngineSupervisor

    supervisor = supervisor or EngineSupervisor(settings)
    pool = await supervisor.start()
    try:
        await serve_app(settings, pool, shutdown, stopping)
    finally:
        await supervisor.close()


def serve_forever(settings: Settings, supervisor: EngineSupervisor | None = None) -> int:
    """Run the server; returns the process exit code (1 when the model failed to load).
    `supervisor`: the engine process's, started already (None: started here).

    The engine runs in a process of its own (ipc/), unless `settings.engine_in_process`.
    `settings.distributed`: under mlx.launch, rank 0 serves HTTP, its engine in a process of
    its own, and every other rank is an engine that follows rank 0's in lock-step
    (engine/cluster/lockstep.py)."""
    cluster = None
    in_process = engine_in_front(settings.engine_in_process, settings.distributed)
    if settings.distributed and in_process:
        from .engine.cluster.lockstep import Cluster, cluster_options

        cluster = Cluster(**cluster_options(settings))
        if not cluster.leader:
            from .engine import Engine

            return Engine(
                settings.model,
                fim_template=settings.fim_template,
                cluster=cluster,
                rank_timeout_s=settings.rank_timeout_s,
            ).follow()
    warn_if_exposed(settings)
    set_switch_interval()
    if in_process:
        warn_if_slow()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        shutdown = asyncio.Event()
        stopping = asyncio.Event()
        failed: list[str] = []
        signalled: list[tuple[str, int]] = []  # the first stop signal, and sequences in flight
        default: list = []  # the default model's engine (or its stand-in)

        def on_fatal(message: str) -> None:
            failed.append(message)
            loop.call_soon_threadsafe(shutdown.set)

        def on_signal(signum: signal.Signals) -> None:
            """The first Ctrl-C or SIGTERM drains; a second one stops at once."""
            if stopping.is_set():
                shutdown.set()
            elif default:
                signalled.append((signum.name, default[0].pending_sequences))
                default[0].stopping_soon()
            stopping.set()

        # Stop cleanly on Ctrl-C and SIGTERM, even when started with SIGINT ignored (a background
        # job of a non-interactive shell): Hypercorn installs no handlers given a shutdown trigger.
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, on_signal, signum)
        log.info(
            "serving on http://%s:%d (model %s loading)",
            settings.host,
            settings.port,
            settings.model,
        )
        if in_process:
            from .engine.models.served import new_engine

            engine = new_engine(settings, settings.model, on_fatal=on_fatal, cluster=cluster)
            default.append(engine)
            try:
                await run(settings, engine, shutdown, stopping=stopping)
            finally:
                engine.stop()
        else:
            from .ipc.mlx_lm_text import use_text_only_mlx_lm
            from .ipc.supervisor import EngineSupervisor

            use_text_only_mlx_lm()
            engine_process = supervisor or EngineSupervisor(settings)
            engine_process.on_fatal = on_fatal
            default.append(engine_process.pool.default)
            try:
                await run_front(settings, shutdown, stopping, engine_process)
            finally:
                engine_process.kill()
        cause, in_flight = signalled[0] if signalled else ("the engine failed", 0)
        log.info("stopped (%s): %d sequences were in flight", cause, in_flight)
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
