"""An adapter's base stays loaded from the moment the adapter is asked for: a front whose event
loop stalls (a busy machine) between the base's load and the adapter's start must not find the
base unloaded for idleness, and the adapter failing with it."""

from __future__ import annotations

import asyncio
import time

from mlxserve.engine.models.served import new_engine, pool_for
from mlxserve.settings import Settings
from mlxserve.tiny_model import build_tiny_adapter

IDLE_UNLOAD_S = 1.0


def test_a_stalled_loop_does_not_cost_an_adapter_its_base(tiny_model, tmp_path):
    adapter = build_tiny_adapter(tiny_model, tmp_path / "tiny-lora")
    settings = Settings(
        model=str(tiny_model),
        adapters=(("tiny-lora", str(adapter)),),
        idle_unload_s=IDLE_UNLOAD_S,
    )
    base = new_engine(settings, str(tiny_model))
    pool = pool_for(settings, base)

    async def acquire_with_a_stall():
        base.start()
        acquiring = asyncio.create_task(pool.acquire("tiny-lora"))
        await asyncio.sleep(0)  # the acquire begins: it waits for the base's load
        assert base.wait_ready(120), base.error
        time.sleep(IDLE_UNLOAD_S * 2.5)  # the loop stalls past the base's idle unload
        adapter_engine = await acquiring
        assert adapter_engine.wait_ready(120), adapter_engine.error
        return adapter_engine

    try:
        adapter_engine = asyncio.run(acquire_with_a_stall())
        assert adapter_engine.loaded is not None
        assert base.loaded is not None, "the base was unloaded under its adapter"
    finally:
        pool.stop()
