"""The engines a server's settings ask for: the default model's, then a pool of every model
served beside it (in the front's process, or in the engine process: ipc/engine_main.py)."""

from __future__ import annotations

import logging
from dataclasses import replace

from ...settings import Settings
from ..engine import Engine
from ..states import NoRoom
from .naming import ServedNames, model_id_for
from .pool import ModelPool

log = logging.getLogger("mlxserve")


def new_engine(settings: Settings, source: str, **options) -> Engine:
    """An engine for `source` as the settings say (not started); `options`: Engine's others
    (its name, thread, loader, cluster, on_fatal). `--draft-model` drafts for the default
    model alone: it shares that model's tokenizer."""
    speculation = settings.speculation
    if source != settings.model and speculation.draft_model is not None:
        speculation = replace(speculation, draft_model=None)
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
        speculation=speculation,
        **options,
    )


def pool_for(settings: Settings, engine: Engine) -> ModelPool:
    """Every model the settings serve, `engine` (the default model's) first; the others' engines
    run on its thread."""

    def make_engine(source: str, name: str, **options) -> Engine:
        return new_engine(settings, source, name=name, thread=engine.thread, **options)

    names = ServedNames.of(settings, engine.model_name)
    return ModelPool(engine, make_engine, settings.memory_budget_bytes, names)


async def start_served_models(pool: ModelPool, settings: Settings) -> None:
    """Load the models named at start besides the default (in the order given), and the
    pinned adapters; one that does not fit is said so and left for a request to load."""
    names = [model_id_for(s) for s in settings.models]
    names += [name for name in pool.pinned if name in pool.adapters]
    for name in names:
        if name == pool.default_name:
            continue
        try:
            await pool.acquire(name)
        except NoRoom as error:
            log.warning("not loaded at start: %s", error)
