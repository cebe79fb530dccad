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
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config

from .api.admission import DRAINING
from .api.app import create_app
from .engine import Engine
from .engine.models.host import model_id_for
from .engine.models.pool import Adapter, ModelPool
from .platform.blas import slow_blas_reason
from .registry import read_json
from .settings import Settings

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


def warn_if_slow_blas() -> None:
    reason = slow_blas_reason()
    if reason is not None:
        log.warning(
            "MLX's CPU backend runs on its reference BLAS, 10-30x slower than OpenBLAS on "
            "prompts and batches: %s",
            reason,
        )


def new_engine(settings: Settings, source: str, **options) -> Engine:
    """An engine for `source` as the settings say (not started); `options`: Engine's others
    (its name, thread, loader, cluster, on_fatal)."""
    return Engine(
        source,
        prefix_cache_bytes=settings.prefix_cache_bytes,
        fim_template=settings.fim_template,
        idle_unload_s=settings.idle_unload_s,
        rank_timeout_s=settings.rank_timeout_s,
        max_stream_gap=settings.max_stream_gap,
        prefix_cache_dir=settings.prefix_cache_dir,
        prefix_cache_disk_bytes=settings.prefix_cache_disk_bytes,
        kv_bits=settings.kv_bits,
        kv_group_size=settings.kv_group_size,
        **options,
    )


def pool_for(settings: Settings, engine: Engine) -> ModelPool:
    """Every model the settings serve, `engine` (the default model's) first; the others' engines
    run on its thread."""
    configured = {model_id_for(source): source for source in settings.models}
    served = {model_id_for(settings.model): settings.model, **configured}
    by_source = {source: name for name, source in served.items()}

    def make_engine(source: str, name: str, **options) -> Engine:
        return new_engine(settings, source, name=name, thread=engine.thread, **options)

    adapters = {}
    for name, path in settings.adapters:
        named = read_json(Path(path).expanduser() / "adapter_config.json").get("model")
        base = by_source.get(named, named if named in served else engine.model_name)
        adapters[name] = Adapter(path, base)
    pins = tuple(by_source.get(pin, model_id_for(pin)) for pin in settings.pins)
    names = {*served, *adapters}
    for pin in pins:
        if pin not in names:
            log.warning("--pin %s: no such model is served (--model or --adapter)", pin)
    for alias, target in settings.aliases:
        if target not in names and target not in by_source:
            log.warning(
                "--alias %s=%s: %s is not served here (--model or --adapter): requests for %s "
                "load it only with --allow-switch, else the default model answers them",
                alias,
                target,
                target,
                alias,
            )
    return ModelPool(
        engine,
        make_engine,
        settings.memory_budget_bytes,
        aliases=dict(settings.aliases),
        adapters=adapters,
        configured=configured,
        pinned=pins,
    )


async def start_served_models(pool: ModelPool, settings: Settings) -> None:
    """Load the models named at start besides the default (in the order given), and the
    pinned adapters; one that does not fit is said so and left for a request to load."""
    from .engine.models.pool import NoRoom

    names = [model_id_for(s) for s in settings.models]
    names += [name for name in pool.pinned if name in pool.adapters]
    for name in names:
        if name == pool.default_name:
            continue
        try:
            await pool.acquire(name)
        except NoRoom as error:
            log.warning("not loaded at start: %s", error)


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
    pool = pool_for(settings, engine)
    app = create_app(settings, pool)
    starting = None
    if start_engine:
        engine.start()  # the others load after it, while the server already answers
        starting = asyncio.create_task(start_served_models(pool, settings))
    drain = None
    if stopping is not None:
        drain = asyncio.create_task(drain_then_stop(app, pool, stopping, shutdown, settings))
    try:
        await serve(app, hypercorn_config(settings), shutdown_trigger=shutdown.wait)
    finally:
        if drain is not None:
            drain.cancel()
        if starting is not None:
            starting.cancel()
        if start_engine:  # the default engine's owner stops it; the others are the pool's
            for other in pool.engines[1:]:
                await asyncio.to_thread(other.stop)


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


def serve_forever(settings: Settings) -> int:
    """Run the server; returns the process exit code (1 when the model failed to load).

    With `settings.distributed` (under mlx.launch), rank 0 serves HTTP and every other rank
    follows its engine in lock-step (engine/cluster/lockstep.py)."""
    cluster = None
    if settings.distributed:
        from .engine.cluster.lockstep import Cluster

        cluster = Cluster()
        log.info("distributed: rank %d of %d (pid %d)", cluster.rank, cluster.size, os.getpid())
        if not cluster.leader:
            return Engine(
                settings.model,
                fim_template=settings.fim_template,
                cluster=cluster,
                rank_timeout_s=settings.rank_timeout_s,
            ).follow()
    warn_if_exposed(settings)
    warn_if_slow_blas()
    set_switch_interval()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        shutdown = asyncio.Event()
        stopping = asyncio.Event()
        failed: list[str] = []
        signalled: list[tuple[str, int]] = []  # the first stop signal, and sequences in flight

        def on_fatal(message: str) -> None:
            failed.append(message)
            loop.call_soon_threadsafe(shutdown.set)

        def on_signal(signum: signal.Signals) -> None:
            """The first Ctrl-C or SIGTERM drains; a second one stops at once."""
            if stopping.is_set():
                shutdown.set()
            else:
                signalled.append((signum.name, engine.pending_sequences))
                engine.stopping_soon()
            stopping.set()

        engine = new_engine(settings, settings.model, on_fatal=on_fatal, cluster=cluster)
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
        try:
            await run(settings, engine, shutdown, stopping=stopping)
        finally:
            engine.stop()
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
