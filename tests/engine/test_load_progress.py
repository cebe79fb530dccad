"""A model load says what it is doing (issue 32: a silent minute-long load), and requests that
arrive during the first load wait for it."""

from __future__ import annotations

import asyncio
import logging
import re

from mlxserve.engine import Engine
from mlxserve.engine.models.host import LoadProgress, load_model
from mlxserve.platform import current_policy

PHASE_LINE = re.compile(r"loading (\S+) \[(\d+\.\d) s\]: ([a-z ]+)(?: \((.*)\))?$")


def logged_phases(caplog) -> list[tuple[str, float, str, str]]:
    """(model, elapsed s, phase, detail) of each phase line logged."""
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxserve.engine"]
    return [
        (m[1], float(m[2]), m[3], m[4] or "") for line in lines if (m := PHASE_LINE.match(line))
    ]


def test_a_load_logs_one_line_a_phase_with_the_weight_files_and_elapsed_time(tiny_model, caplog):
    caplog.set_level(logging.INFO, logger="mlxserve.engine")
    progress = LoadProgress(str(tiny_model))
    load_model(str(tiny_model), progress=progress)
    phases = logged_phases(caplog)
    converting = ["converting weights"] if current_policy().converts_weights else []
    assert [phase for _, _, phase, _ in phases] == [
        "reading config and tokenizer",
        "reading weights",
        *converting,
        "calibrating",
    ]
    assert {model for model, _, _, _ in phases} == {tiny_model.name}
    elapsed = [seconds for _, seconds, _, _ in phases]
    assert elapsed == sorted(elapsed)
    weights = tiny_model / "model.safetensors"
    size_mb = f"{weights.stat().st_size / 1e6:.1f} MB"
    assert phases[1][3] == f"1 file: model.safetensors, {size_mb}"
    reported = progress.as_dict()
    assert set(reported) == {
        "phase",
        "weight_files",
        "weight_bytes",
        "elapsed_s",
        "phase_elapsed_s",
    }
    assert (reported["phase"], reported["weight_files"], reported["weight_bytes"]) == (
        "calibrating",
        1,
        weights.stat().st_size,
    )
    assert reported["elapsed_s"] >= reported["phase_elapsed_s"] >= 0


def test_a_request_during_the_first_load_waits_for_it(tiny_model):
    engine = Engine(str(tiny_model)).start()
    try:
        assert engine.state == "loading" and engine.load_progress is not None
        asyncio.run(engine.ensure_loaded(timeout=60))
        assert engine.state == "ready" and engine.loaded is not None
        assert engine.load_progress is None  # none once loaded
    finally:
        engine.stop()


def test_an_engine_not_started_is_not_waited_for(tiny_model):
    engine = Engine(str(tiny_model))
    asyncio.run(asyncio.wait_for(engine.ensure_loaded(timeout=60), timeout=5))
    assert engine.state == "starting"
