"""The engine's greedy tokens are mlx-lm's own on every kind of model users run: the tiny float32
model, a 4-bit copy of it and the shared 4-bit SmolLM2. Under MLXSERVE_PORTABLE=1 (as on a Mac's
GPU) quantized weights stay quantized; otherwise the CPU backend widens them first."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler

from mlxserve.engine import Engine
from mlxserve.platform import current_policy

from ..conftest import SMOLLM2, SMOLLM2_ID, shared_model
from .test_engine import request, run, token_ids

PROMPT = (1, 40, 41, 42, 43, 44, 45, 46, 47, 48)
TOKENS = 16


# SmolLM2 is slow in the portable pass: its load alone spends ~45 s of a core in MLX's CPU
# quantized kernels (a Mac runs them on its GPU); tiny-4bit takes the unwidened quantized path
# there, and SmolLM2's answers are checked in the CPU pass.
@pytest.fixture(
    params=[
        "tiny",
        "tiny-4bit",
        pytest.param("smollm2", id=SMOLLM2_ID, marks=pytest.mark.slow),
    ]
)
def model_engine(request, tiny_model, tiny_model_4bit):
    """A model's folder and an engine on it, started and ready. SmolLM2's is the session's."""
    if request.param == "smollm2":
        yield shared_model(SMOLLM2), request.getfixturevalue("smollm2_engine")
        return
    path = tiny_model if request.param == "tiny" else tiny_model_4bit
    engine = Engine(str(path)).start()
    try:
        assert engine.wait_ready(120), engine.error
        yield path, engine
    finally:
        engine.stop()


def test_greedy_decoding_is_mlx_lms(model_engine):
    model_path, engine = model_engine
    model, tokenizer = mlx_lm.load(str(model_path))
    out = mlx_lm.stream_generate(
        model, tokenizer, mx.array(PROMPT), max_tokens=TOKENS, sampler=make_sampler(0.0)
    )
    expected = [r.token for r in out]
    quantized = any(
        isinstance(m, nn.QuantizedLinear) for _, m in engine.loaded.model.named_modules()
    )
    was_quantized = "quantization" in (model_path / "config.json").read_text()
    assert quantized == (was_quantized and not current_policy().cpu_tricks)
    events = run(engine, [request(prompt=PROMPT, max_tokens=TOKENS)])[0]
    assert token_ids(events) == expected
