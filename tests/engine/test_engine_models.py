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

from ..conftest import shared_model
from .test_engine import request, run, token_ids

PROMPT = (1, 40, 41, 42, 43, 44, 45, 46, 47, 48)
TOKENS = 16


@pytest.fixture(params=["tiny", "tiny-4bit", "smollm2-4bit"])
def model_path(request, tiny_model, tiny_model_4bit):
    if request.param == "tiny":
        return tiny_model
    if request.param == "tiny-4bit":
        return tiny_model_4bit
    return shared_model("smollm2-135m-instruct-4bit")


def test_greedy_decoding_is_mlx_lms(model_path):
    model, tokenizer = mlx_lm.load(str(model_path))
    out = mlx_lm.stream_generate(
        model, tokenizer, mx.array(PROMPT), max_tokens=TOKENS, sampler=make_sampler(0.0)
    )
    expected = [r.token for r in out]
    engine = Engine(str(model_path)).start()
    try:
        assert engine.wait_ready(120), engine.error
        quantized = any(
            isinstance(m, nn.QuantizedLinear) for _, m in engine.loaded.model.named_modules()
        )
        was_quantized = "quantization" in (model_path / "config.json").read_text()
        assert quantized == (was_quantized and not current_policy().cpu_tricks)
        events = run(engine, [request(prompt=PROMPT, max_tokens=TOKENS)])[0]
    finally:
        engine.stop()
    assert token_ids(events) == expected
